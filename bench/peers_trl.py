"""TRL's GRPOTrainer against zbrl sync (max_staleness 0) and zbrl async, side by side.

The same warm-started embedded model and tokenizer, training prompts, reward, group size, batch,
learning rate and generation length (the recipe's; the demo by default), on the same cores, in
one invocation; the runs of a repeat are interleaved (the order rotates per repeat). Held-out
accuracy is measured with one evaluator for all (zbrl's, greedy, on the recipe's held-out
prompts) on weight snapshots taken every ``--eval-every`` steps, after the runs: no evaluation
ever runs inside a training clock.

- zbrl: checkpoints every ``--eval-every`` steps (``logging.save_interval``; their writing is
  inside zbrl's clock, and reported); a checkpoint of step K is placed at the end of the
  consumer's ``train_step`` span of step K, measured from the first span after start-up.
- TRL: a callback copies the weights every ``--eval-every`` steps with the clock paused; the clock
  starts at ``on_train_begin``.

Needs TRL (``make setup-peers``):

    .venv-peers/bin/python bench/peers_trl.py                          # demo recipe, 300 steps
    .venv-peers/bin/python bench/peers_trl.py --steps 60 --repeats 2 --budgets 10 20
    .venv-peers/bin/python bench/peers_trl.py --systems trl async --json out.json key=value
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from peerlib.curves import (
    CurvePoint,
    accuracy_at_budget,
    median_time,
    median_value,
    per_core_rate,
    ratio,
    steps_per_second,
    time_to_accuracy,
)
from peerlib.trl_args import grpo_config_kwargs
from peerlib.trl_inputs import trl_dataset_and_reward
from zbrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
SYSTEMS = ("trl", "zbrl-sync", "zbrl-async")


# -- the shared pieces: model, prompts, reward, evaluator -----------------------------------------


class Shared:
    """What every system gets from zbrl's own assembly: the warm-started model directory, the
    tokenizer, the encoded training and held-out prompts, the reward and the evaluator."""

    def __init__(self, cfg, cores: int) -> None:
        from zbrl.assembly.artifacts import prepare_artifacts
        from zbrl.assembly.environments import build_episode_runner
        from zbrl.assembly.models import inference_dtype, load_policy, load_tokenizer
        from zbrl.assembly.rewards import build_reward_fn
        from zbrl.assembly.settings import eval_sampling_params
        from zbrl.evaluation.evaluator import EvalSet, Evaluator
        from zbrl.launch.inputs import encode_datasets
        from zbrl.models.quiet import quiet_transformers
        from zbrl.rollout.backends.transformers.backend import TransformersBackend

        quiet_transformers()
        self.cfg = cfg
        self.cores = cores
        self.artifacts = prepare_artifacts(cfg)
        self.tokenizer = load_tokenizer(cfg, self.artifacts.tokenizer_dir)
        self.train_prompts, eval_sets = encode_datasets(cfg, self.artifacts)
        if len(eval_sets) != 1:
            raise SystemExit(f"need exactly one eval set, the recipe has {sorted(eval_sets)}")
        ((self.eval_name, eval_prompts),) = eval_sets.items()
        self.reward_fn = build_reward_fn(cfg)
        self.load_policy = lambda path: load_policy(cfg, Path(path), inference_dtype(cfg))
        self.backend = TransformersBackend(
            self.load_policy(self.artifacts.model_dir), self.tokenizer
        )
        params = eval_sampling_params(cfg)
        self.evaluator = Evaluator(
            self.backend,
            build_episode_runner(cfg, self.backend, params.max_new_tokens),
            self.reward_fn,
            [EvalSet(self.eval_name, eval_prompts)],
            params,
            batch_size=cfg.eval.batch_size,
            out_dir=None,
        )
        self.num_eval = len(eval_prompts)

    def accuracy(self, state_dict: dict[str, torch.Tensor]) -> float:
        with _threads(self.cores):
            self.backend.load_weights(state_dict)
            torch.manual_seed(12345)
            return self.evaluator.run(0)[self.eval_name]["accuracy"]


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- zbrl -----------------------------------------------------------------------------------------


def run_zbrl(shared: Shared, args, staleness: int, out: Path) -> dict[str, Any]:
    from zbrl.launch.driver import run_training
    from zbrl.launch.steps import epochs_for_steps

    num_prompts = len(shared.train_prompts)

    cfg = load_config(
        args.recipe,
        [
            *args.overrides,
            *_common_overrides(args),
            f"transport.max_staleness={staleness}",
            f"logging.run_dir={out}",
            "logging.progress=false",
            f"logging.save_interval={args.eval_every}",
            "logging.save_keep=0",
            "logging.save_final=true",
            "eval.sets={}",
            # TRL runs --steps whatever the epochs; zbrl stops when its data.num_epochs run out
            f"data.num_epochs={epochs_for_steps(shared.cfg, num_prompts, args.steps)}",
        ],
    )
    summary = run_training(cfg)
    run_dir = Path(summary["run_dir"])
    return {"run_dir": str(run_dir), **zbrl_timing(run_dir, args.eval_every, cfg)}


def zbrl_timing(run_dir: Path, eval_every: int, cfg) -> dict[str, Any]:
    """Training-clock time of each checkpoint, and the time split, from the run's own spans."""
    from peerlib.zbrl_clock import checkpoint_times, save_overhead
    from zbrl.telemetry.metrics import read_metrics
    from zbrl.telemetry.spans import GENERATE, TRAIN_STEP
    from zbrl.telemetry.timeline import read_timeline

    spans = read_timeline(run_dir)
    paths = {int(p.name.split("-")[1]): p for p in (run_dir / "checkpoints").glob("step-*")}
    times = checkpoint_times(spans, paths)
    train = [s for s in spans if s.name == TRAIN_STEP]
    durations = {int(s.attrs["step"]) + 1: s.duration for s in train}
    metrics = [m for m in read_metrics(run_dir) if "train_tokens_per_s" in m]
    summary = json.loads((run_dir / "summary.json").read_text())
    lengths = [
        m["response_length"]
        for m in metrics
        if "response_length" in m and not math.isnan(m["response_length"])
    ]
    return {
        "checkpoints": {k: (t, str(paths[k])) for k, t in times.items()},
        "steps": summary["steps"],
        "generate_s": sum(s.duration for s in spans if s.name == GENERATE),
        "train_s": sum(durations.values()),
        # generated: the mean trained response length times every sample generated
        "generation_tokens": (
            statistics.fmean(lengths) * summary["samples_generated"] if lengths else 0.0
        ),
        "train_tokens": sum(
            m["train_tokens_per_s"] * durations.get(m["step"], 0.0) for m in metrics
        ),
        "generation_cores": cfg.launch.torch_threads,
        "train_cores": cfg.launch.torch_threads,
        "checkpoint_overhead_s": save_overhead(spans, eval_every),
    }


def zbrl_curve(shared: Shared, run: dict[str, Any], initial: float) -> list[CurvePoint]:
    points = [CurvePoint(0, 0.0, initial)]
    for step, (seconds, path) in sorted(run["checkpoints"].items()):
        state = shared.load_policy(path).state_dict()
        points.append(CurvePoint(step, seconds, shared.accuracy(state)))
    return points


# -- TRL ------------------------------------------------------------------------------------------


def run_trl(shared: Shared, args, out: Path) -> dict[str, Any]:
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = shared.cfg
    tokenizer = shared.tokenizer
    translation = grpo_config_kwargs(
        cfg, output_dir=str(out), max_steps=args.steps, threads=args.cores
    )
    dataset, zbrl_reward = trl_dataset_and_reward(
        cfg, tokenizer, shared.train_prompts, shared.reward_fn
    )
    split = {"generate_s": 0.0, "prepare_s": 0.0, "generation_tokens": 0, "train_tokens": 0}

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with its own time split: generation, and everything before the loss."""

        def _generate_single_turn(self, prompt_ids, *a, **kw):
            start = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *a, **kw)
            split["generate_s"] += time.perf_counter() - start
            # one prompt entry per completion (TRL repeats each prompt num_generations times)
            split["generation_tokens"] += sum(len(c) for c in completion_ids)
            split["train_tokens"] += sum(len(c) for c in completion_ids)
            split["train_tokens"] += sum(len(p) for p in prompt_ids)
            return completion_ids, logprobs

        def _prepare_inputs(self, generation_batch):
            start = time.perf_counter()
            out = super()._prepare_inputs(generation_batch)
            split["prepare_s"] += time.perf_counter() - start
            return out

    snapshots: list[tuple[int, float, dict[str, torch.Tensor]]] = []
    clock = {"start": 0.0, "paused": 0.0, "end": 0.0}

    class Snapshots(TrainerCallback):
        def on_train_begin(self, targs, state, control, **kw):
            clock["start"] = time.perf_counter()

        def on_step_end(self, targs, state, control, model=None, **kw):
            step = state.global_step
            if step % 50 == 0:
                seconds = time.perf_counter() - clock["start"] - clock["paused"]
                print(f"[peers] trl: step {step}, clock {seconds:.1f} s", flush=True)
            if step % args.eval_every and step != args.steps:
                return
            now = time.perf_counter()
            seconds = now - clock["start"] - clock["paused"]
            weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
            snapshots.append((step, seconds, weights))
            clock["paused"] += time.perf_counter() - now

        def on_train_end(self, targs, state, control, **kw):
            clock["end"] = time.perf_counter() - clock["start"] - clock["paused"]

    with _threads(args.cores):
        torch.manual_seed(cfg.seed)
        trainer = TimedGRPOTrainer(
            model=shared.load_policy(shared.artifacts.model_dir),
            reward_funcs=[zbrl_reward],
            args=GRPOConfig(**translation.kwargs),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Snapshots()],
        )
        trainer.train()
    step_s = clock["end"]
    return {
        "snapshots": snapshots,
        "steps": trainer.state.global_step,
        "generate_s": split["generate_s"],
        "train_s": step_s - split["prepare_s"],
        "generation_tokens": split["generation_tokens"],
        "train_tokens": split["train_tokens"],
        "generation_cores": args.cores,
        "train_cores": args.cores,
        "checkpoint_overhead_s": 0.0,
        "unmatched": translation.unmatched,
    }


def trl_curve(shared: Shared, run: dict[str, Any], initial: float) -> list[CurvePoint]:
    points = [CurvePoint(0, 0.0, initial)]
    for step, seconds, weights in run.pop("snapshots"):
        points.append(CurvePoint(step, seconds, shared.accuracy(weights)))
    return points


# -- the comparison -------------------------------------------------------------------------------


def _common_overrides(args) -> list[str]:
    return [f"training.max_steps={args.steps}", "eval.temperature=0"]


def summarise(runs: dict[str, list[dict]], targets, budgets) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for system, reps in runs.items():
        curves = [[CurvePoint(**p) for p in r["curve"]] for r in reps]
        row: dict[str, Any] = {
            "repeats": len(reps),
            "time_to": {
                f"{t:g}": median_time([time_to_accuracy(c, t) for c in curves]) for t in targets
            },
            "acc_at": {
                f"{b:g}": median_value([accuracy_at_budget(c, b) for c in curves]) for b in budgets
            },
            "steps_per_s": median_value([steps_per_second(c) for c in curves]),
            "final_accuracy": median_value([c[-1].accuracy for c in curves]),
            "train_clock_s": median_value([c[-1].seconds for c in curves]),
            "checkpoint_overhead_s": median_value([r["checkpoint_overhead_s"] for r in reps]),
            "gen_tok_per_s_per_core": median_value(
                [
                    per_core_rate(r["generation_tokens"], r["generate_s"], r["generation_cores"])
                    for r in reps
                ]
            ),
            "train_tok_per_s_per_core": median_value(
                [per_core_rate(r["train_tokens"], r["train_s"], r["train_cores"]) for r in reps]
            ),
            "generate_s": median_value([r["generate_s"] for r in reps]),
            "train_s": median_value([r["train_s"] for r in reps]),
            "cores": (reps[0]["generation_cores"], reps[0]["train_cores"]) if reps else None,
        }
        table[system] = row
    return table


def _fmt(value, spec: str, none: str = "never") -> str:
    return none if value is None else format(value, spec)


def print_table(table: dict[str, dict[str, Any]], targets, budgets) -> None:
    cols = (
        [f"t@{t:g}" for t in targets]
        + [f"acc@{b:g}s" for b in budgets]
        + ["final", "train s", "steps/s", "ckpt s"]
    )
    header = f"{'system':<11}" + "".join(f"{c:>9}" for c in cols)
    print("\nheld-out greedy accuracy vs training time (evaluation excluded; medians over repeats)")
    print(header)
    print("-" * len(header))
    for system, row in table.items():
        cells = [_fmt(row["time_to"][f"{t:g}"], ".1f") for t in targets]
        cells += [_fmt(row["acc_at"][f"{b:g}"], ".3f", "n/a") for b in budgets]
        cells += [
            _fmt(row["final_accuracy"], ".3f"),
            _fmt(row["train_clock_s"], ".1f"),
            _fmt(row["steps_per_s"], ".2f"),
            _fmt(row["checkpoint_overhead_s"], ".2f"),
        ]
        print(f"{system:<11}" + "".join(f"{c:>9}" for c in cells))
    print("\nper-core rates (each system's own time split)")
    header = (
        f"{'system':<11}{'gen s':>8}{'train s':>9}{'cores g/t':>10}"
        f"{'gen tok/s/core':>16}{'train tok/s/core':>18}"
    )
    print(header)
    print("-" * len(header))
    for system, row in table.items():
        cores = row["cores"]
        print(
            f"{system:<11}{_fmt(row['generate_s'], '.1f'):>8}{_fmt(row['train_s'], '.1f'):>9}"
            f"{f'{cores[0]}/{cores[1]}':>10}"
            f"{_fmt(row['gen_tok_per_s_per_core'], '.0f', 'n/a'):>16}"
            f"{_fmt(row['train_tok_per_s_per_core'], '.0f', 'n/a'):>18}"
        )
    if "trl" in table:
        for system in ("zbrl-async", "zbrl-sync"):
            if system not in table:
                continue
            for t in targets:
                r = ratio(table["trl"]["time_to"][f"{t:g}"], table[system]["time_to"][f"{t:g}"])
                print(f"{system} reaches {t:g} {_fmt(r, '.2f', 'n/a')}x as soon as TRL")


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", flush=True)
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {"trl": "tab:red", "zbrl-sync": "tab:blue", "zbrl-async": "tab:green"}
    for system, reps in runs.items():
        for i, r in enumerate(reps):
            xs = [p["seconds"] for p in r["curve"]]
            ys = [p["accuracy"] for p in r["curve"]]
            ax.plot(
                xs,
                ys,
                color=colours.get(system),
                alpha=0.9 if i == 0 else 0.4,
                label=system if i == 0 else None,
                marker=".",
            )
    ax.set_xlabel("training wall-clock seconds (evaluation excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}", flush=True)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every system")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of runs; medians reported")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between eval points")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.6, 0.7, 0.75])
    parser.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        default=[15, 30, 60],
        help="training seconds at which to read the accuracy",
    )
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument(
        "--staleness",
        type=int,
        default=None,
        help="max_staleness of zbrl async (default: the recipe's)",
    )
    parser.add_argument("--cores", type=int, default=2, help="torch threads of the TRL process")
    parser.add_argument("--out", default=None, help="directory for runs, JSON and plot")
    parser.add_argument("--json", default=None, help="results JSON (default OUT/peers_trl.json)")
    args = parser.parse_args()
    if (os.cpu_count() or 0) < args.cores:
        print(f"warning: {args.cores} cores asked, {os.cpu_count()} present", file=sys.stderr)
    out = Path(args.out or tempfile.mkdtemp(prefix="zbrl-peers-"))
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(args.recipe, [*args.overrides, *_common_overrides(args)])
    staleness = (
        args.staleness if args.staleness is not None else max(1, cfg.transport.max_staleness)
    )
    load_before = _load()
    shared = Shared(cfg, args.cores)
    initial = shared.accuracy(shared.load_policy(shared.artifacts.model_dir).state_dict())
    print(
        f"[peers] starting policy: held-out greedy accuracy {initial:.3f} "
        f"({shared.num_eval} prompts)",
        flush=True,
    )
    runs: dict[str, list[dict]] = {s: [] for s in args.systems}
    unmatched: list[str] = []
    for rep in range(args.repeats):
        order = args.systems[rep % len(args.systems) :] + args.systems[: rep % len(args.systems)]
        for system in order:
            print(f"[peers] repeat {rep + 1}/{args.repeats}: {system}", flush=True)
            where = out / f"{system}-{rep}"
            if system == "trl":
                run = run_trl(shared, args, where)
                unmatched = run.pop("unmatched")
                curve = trl_curve(shared, run, initial)
            else:
                s = 0 if system == "zbrl-sync" else staleness
                run = run_zbrl(shared, args, s, where)
                curve = zbrl_curve(shared, run, initial)
                run.pop("checkpoints")
            print(
                f"[peers] {system}: {run['steps']} steps, clock {curve[-1].seconds:.1f} s, "
                f"final accuracy {curve[-1].accuracy:.3f} ({len(curve)} points)",
                flush=True,
            )
            run["curve"] = [asdict(p) for p in curve]
            runs[system].append(run)
            partial = out / "peers_trl.partial.json"  # what is done so far, if a later run fails
            partial.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))
    load_after = _load()
    table = summarise(runs, args.targets, args.budgets)
    print_table(table, args.targets, args.budgets)
    if not unmatched:
        unmatched = grpo_config_kwargs(
            cfg, output_dir="-", max_steps=1, threads=args.cores
        ).unmatched
    print("\nnot matched between TRL and zbrl:")
    for note in unmatched:
        print(f"- {note}")
    print(
        f"\nload average (1/5/15 min) before: {load_before}, after: {load_after}; "
        f"{os.cpu_count()} cores; zbrl async max_staleness={staleness}"
    )
    result = {
        "args": vars(args),
        "initial_accuracy": initial,
        "table": table,
        "runs": runs,
        "unmatched": unmatched,
        "load_before": load_before,
        "load_after": load_after,
    }
    path = Path(args.json) if args.json else out / "peers_trl.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"json: {path}")
    plot(runs, out / "peers_trl.png")


if __name__ == "__main__":
    main()
