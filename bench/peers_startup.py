"""Start-up of TRL's GRPOTrainer and of zbrl, each a fresh process timed from outside, and the
time to a held-out accuracy counting it (issue 32: "reaches the same held-out accuracy sooner
counting start-up").

``bench/peers_trl.py`` times training only: TRL's clock starts at ``on_train_begin``, zbrl's at
its first span after start-up. What a user waits for also holds the start: the interpreter, the
imports, the model, the trainer (TRL) or Ray and its workers (zbrl), up to the first step. Here
each start is a fresh process on the demo recipe, from just before it is started to the end of
its first training step:

- **zbrl**: ``zbrl train recipes/demo.yaml eval.sets={}`` as ``bench/startup.py`` runs it (the
  warm start and the encoded prompts cached, as on a clone's second run), to its first metrics
  line (written at the end of the first step).
- **TRL**: this file run as a child (``--trl-child``): it imports torch, TRL and datasets, loads
  the same warm-started model and tokenizer, builds the same dataset and reward as
  ``peers_trl.py`` (zbrl's cached prompts: a TRL user's dataset is at hand too) and a
  ``GRPOTrainer`` with the same settings, and trains; a callback notes the time at the end of
  step 1 and stops the run.

The runs alternate (TRL, zbrl, TRL, ...); medians are printed. With ``--peers-json`` (a
``peers_trl.json`` of the same recipe) the times to each of its targets are printed with each
system's median start-up added, and zbrl async's lead over TRL counting start-up. Needs TRL
(``make setup-peers``):

    .venv-peers/bin/python bench/peers_startup.py --runs 5
    .venv-peers/bin/python bench/peers_startup.py --runs 5 --peers-json /tmp/peers/peers_trl.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peerlib.curves import with_startup

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "demo.yaml"


def _bench_startup():
    """``bench/startup.py`` as a module (its zbrl run and cache folder)."""
    spec = importlib.util.spec_from_file_location("bench_startup", REPO / "bench" / "startup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trl_child(marker: Path, cache: str, cores: int) -> None:
    """TRL's start: everything a GRPOTrainer run needs, to the end of its first step."""
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from peerlib.trl_args import grpo_config_kwargs
    from peerlib.trl_inputs import trl_dataset_and_reward
    from zbrl.assembly.artifacts import prepare_artifacts
    from zbrl.assembly.models import compute_dtype, load_policy, load_tokenizer
    from zbrl.assembly.rewards import build_reward_fn
    from zbrl.config import load_config
    from zbrl.launch.inputs import encode_datasets

    torch.set_num_threads(cores)
    cfg = load_config(str(RECIPE), ["eval.sets={}", f"logging.cache_dir={cache}"])
    artifacts = prepare_artifacts(cfg)
    tokenizer = load_tokenizer(cfg, artifacts.tokenizer_dir)
    train_prompts, _ = encode_datasets(cfg, artifacts)
    dataset, reward = trl_dataset_and_reward(cfg, tokenizer, train_prompts, build_reward_fn(cfg))
    out = tempfile.mkdtemp(prefix="zbrl-trl-start-")
    translation = grpo_config_kwargs(cfg, output_dir=out, max_steps=2, threads=cores)

    class FirstStep(TrainerCallback):
        def on_step_end(self, targs, state, control, **kw):
            marker.write_text(repr(time.time()))
            control.should_training_stop = True

    torch.manual_seed(cfg.seed)
    trainer = GRPOTrainer(
        model=load_policy(cfg, Path(artifacts.model_dir), compute_dtype(cfg)),
        reward_funcs=[reward],
        args=GRPOConfig(**translation.kwargs),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[FirstStep()],
    )
    trainer.train()


def run_trl(tmp: Path, cache: Path, cores: int, i: int) -> float:
    marker = tmp / f"trl-{i}.time"
    log = tmp / f"trl-{i}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "bench")])}
    command = [sys.executable, __file__, "--trl-child", str(marker), "--cache", str(cache)]
    command += ["--cores", str(cores)]
    t0 = time.time()
    with log.open("w") as f:
        done = subprocess.run(command, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=900)
    if done.returncode != 0 or not marker.exists():
        tail = log.read_text()[-3000:]
        raise SystemExit(f"TRL's start exited {done.returncode}; the end of {log}:\n{tail}")
    return float(marker.read_text()) - t0


def run_zbrl(bench, tmp: Path, cache: Path, i: int, staleness: int | None) -> float:
    extra = [] if staleness is None else [f"transport.max_staleness={staleness}"]
    figures = bench.run_once(REPO, tmp / f"zbrl-{i}", 3, extra, cache, 0.0)
    return figures["first_metrics_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh starts of each system")
    parser.add_argument("--cores", type=int, default=2, help="torch threads of the TRL process")
    parser.add_argument("--staleness", type=int, default=None, help="zbrl's max_staleness")
    parser.add_argument("--peers-json", default=None, help="a peers_trl.json to add start-up to")
    parser.add_argument("--json", default=None, help="write the start-ups here")
    parser.add_argument("--trl-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_child:
        trl_child(Path(args.trl_child), args.cache, args.cores)
        return
    bench = _bench_startup()
    times: dict[str, list[float]] = {"trl": [], "zbrl": []}
    with tempfile.TemporaryDirectory(prefix="zbrl-peers-start-") as tmp_name:
        tmp = Path(tmp_name)
        cache = bench.bench_cache(tmp)
        run_zbrl(bench, tmp, cache, -1, args.staleness)  # fills the caches: not measured
        run_trl(tmp, cache, args.cores, -1)
        for i in range(args.runs):
            times["trl"].append(run_trl(tmp, cache, args.cores, i))
            times["zbrl"].append(run_zbrl(bench, tmp, cache, i, args.staleness))
            print(
                f"run {i}: TRL {times['trl'][-1]:.2f} s, zbrl {times['zbrl'][-1]:.2f} s "
                f"(load average {os.getloadavg()[0]:.2f})",
                flush=True,
            )
    medians = {name: statistics.median(values) for name, values in times.items()}
    print("\nfrom the command's start to the end of its first training step (fresh processes)")
    for name, values in times.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:<6} median {medians[name]:6.2f} s   ({shown})")
    if args.peers_json:
        peers = json.loads(Path(args.peers_json).read_text())
        print()
        starts = {
            "trl": medians["trl"],
            "zbrl-sync": medians["zbrl"],
            "zbrl-async": medians["zbrl"],
        }
        print("\n".join(with_startup(peers["table"], starts)))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": times, "medians": medians}, indent=2))


if __name__ == "__main__":
    main()
