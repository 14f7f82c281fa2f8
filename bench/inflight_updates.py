"""In-flight weight updates against batch-boundary swaps, on the demo and a longer-response variant.

For each variant and seed, one run per mode one after the other in this process (each with its
own local Ray, loopback only): ``batch`` (weights swapped between generation batches, the
default), ``inflight`` (``rollout.inflight_updates.enabled=true``: new weights between chunks of
``--chunk-tokens`` tokens, the cache recomputed after a swap) and, with ``--modes``, ``keep``
(the same with ``after_swap: keep``). The table shows, as means over the seeds: the mean per-token
staleness (trained version minus the version that sampled each token, ``summary.json``'s
``mean_token_staleness``), the share of trained tokens sampled by older weights than the
trainer's (``drift_token_frac``), the held-out accuracy gain (final minus initial evaluation),
throughput (response tokens generated per second of the training window, from the buffer's
per-batch means in ``metrics.jsonl``), the producers' idle share and the overlap efficiency.

``demo`` is ``recipes/demo.yaml`` as it is (responses ≈ 20 tokens of a 32-token budget);
``long`` raises the budget to ``--long-tokens`` and generates ``--long-batch`` prompts per
generation call, so one call spans several training steps (what long reasoning responses do to a
producer), which is where swapping only at batch boundaries leaves tokens stalest.

    python bench/inflight_updates.py                        # ~8-10 min on 2 quiet cores
    python bench/inflight_updates.py --steps 300 --seeds 0 1 2 --eval-prompts 200
    python bench/inflight_updates.py --variants long --steps 40 --eval-prompts 50  # a smoke run

``--overhead MODEL_DIR`` times generation alone instead (no Ray, no training), interleaved on one
thread: one demo-sized batch (8 prompts of the embedded task × G = 8, the demo's sampling) with
one ``generate`` call, in chunks without a new version, and in chunks with a new version at every
chunk boundary (the same weights reloaded, so each swap pays the load and, unless the cache is
kept, its recompute):

    python bench/inflight_updates.py --overhead .cache/zbrl/warm-<hash> --repeats 20

``--backend vllm`` (in .venv-vllm) times the same on the vLLM backend: ``LLM.generate`` against
the engine stepped by hand (zbrl/rollout/backends/vllm/inflight.py) without and with a new
version every ``--chunk-tokens`` steps. The training runs take the backend from the overrides
(``rollout.backend.type=vllm``).

    .venv-vllm/bin/python bench/inflight_updates.py --backend vllm --overhead .cache/zbrl/warm-<h>
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from zbrl.config import load_config
from zbrl.launch.driver import run_training

REPO = Path(__file__).resolve().parents[1]
# tests/helpers: the test harness this bench reuses (vllm_settings)
sys.path.insert(0, str(REPO / "tests"))
MODES = ("batch", "inflight", "keep")
FIGURES = (
    ("token staleness", "mean_token_staleness", "{:>15.2f}"),
    ("drift tokens", "drift_token_frac", "{:>12.1%}"),
    ("held-out gain", "heldout_gain", "{:>+13.3f}"),
    ("gen tok/s", "generated_tokens_per_s", "{:>9.0f}"),
    ("prod idle", "producer_idle_frac", "{:>9.1%}"),
    ("cons idle", "consumer_idle_frac", "{:>9.1%}"),
    ("overlap", "overlap_efficiency", "{:>7.2f}"),
    ("resp len", "response_length", "{:>8.1f}"),
    ("wall s", "wall_s", "{:>6.0f}"),
)


def variant_overrides(args: argparse.Namespace) -> dict[str, list[str]]:
    return {
        "demo": [],
        "long": [
            f"rollout.generation.max_new_tokens={args.long_tokens}",
            f"rollout.inference_batch_size={args.long_batch}",
            f"rollout.inference_microbatch_size={args.long_batch}",
            f"transport.max_staleness={args.long_staleness}",
        ],
    }


def run_once(args: argparse.Namespace, overrides: list[str], out: Path) -> dict:
    cfg = load_config(
        args.recipe,
        [
            *overrides,
            f"training.max_steps={args.steps}",
            f"eval.max_prompts={args.eval_prompts}",
            "eval.interval=0",
            f"logging.run_dir={out}",
            "logging.progress=false",
            "logging.save_final=false",
            "logging.log_rollout_interval=0",
        ],
    )
    summary = run_training(cfg)
    return figures(summary, cfg.rollout.generation.num_generations)


def figures(summary: dict, group_size: int) -> dict:
    """The table's figures of one run (its summary plus sums over its metrics.jsonl)."""
    run_dir = Path(summary["run_dir"])
    steps = [
        row
        for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if "loss" in row
    ]
    generated = sum(
        (r.get("raw_groups") or 0) * group_size * (r.get("response_length") or 0) for r in steps
    )
    drift = [r["drift_token_frac"] for r in steps if r.get("drift_token_frac") is not None]
    initial, final = summary["eval_accuracy_initial"], summary["eval_accuracy_final"]
    return {
        "mean_token_staleness": summary["mean_token_staleness"],
        "drift_token_frac": sum(drift) / len(drift) if drift else float("nan"),
        "heldout_gain": final - initial if None not in (initial, final) else float("nan"),
        "generated_tokens_per_s": generated / summary["wall_s"],
        "producer_idle_frac": summary["producer_idle_frac"],
        "consumer_idle_frac": summary["consumer_idle_frac"],
        "response_length": _weighted(steps, "response_length"),
        "truncated_frac": statistics.fmean(r["truncated_frac"] for r in steps),
        "overlap_efficiency": summary["overlap_efficiency"],
        "wall_s": summary["wall_s"],
        "eval_accuracy_initial": initial,
        "eval_accuracy_final": final,
        "steps": summary["steps"],
    }


def overhead_backend(name: str, model_dir: str):
    """The backend ``--overhead`` times, on one thread."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    if name == "vllm":
        from helpers.backends import vllm_settings
        from zbrl.rollout.backends.vllm.backend import VllmBackend

        settings = vllm_settings(max_model_len=None, inflight_updates=True)
        return VllmBackend(model_dir, model_dir, settings)
    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return TransformersBackend(AutoModelForCausalLM.from_pretrained(model_dir), tokenizer)


def overhead(model_dir: str, chunk_tokens: int, repeats: int, backend_name: str) -> None:
    """Seconds per demo-sized generate call: unchunked, chunked, chunked with swaps."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zbrl.assembly.settings import sampling_params
    from zbrl.data.prompts import PromptEncoder
    from zbrl.embedded.addition_task import make_arithmetic_rows
    from zbrl.rollout.inflight import InflightSwap, generate_inflight

    backend = overhead_backend(backend_name, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cfg = load_config(args_recipe(), [])
    params = sampling_params(cfg)  # the recipe's, as a producer builds them
    encoder = PromptEncoder(tokenizer, max_prompt_tokens=512, system_prompt=None)
    prompts = [encoder.token_ids(row) for row in make_arithmetic_rows(8, seed=0)]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    counter = iter(range(1, 10**9))

    def new_version_each_time() -> int:
        backend.load_weights(weights)
        return next(counter)

    modes = {
        "one call": None,
        "chunks": InflightSwap(chunk_tokens, lambda: 0),
        "chunks+swaps": InflightSwap(chunk_tokens, new_version_each_time),
        "swaps, keep": InflightSwap(chunk_tokens, new_version_each_time, keep_cache=True),
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    tokens: dict[str, list[int]] = {m: [] for m in modes}
    for rep in range(repeats + 1):
        for mode, inflight in modes.items():
            torch.manual_seed(rep)
            start = time.perf_counter()
            if inflight is None:
                out = backend.generate(prompts, params)
            else:
                out = generate_inflight(backend, prompts, params, inflight)
            if rep:  # the first round warms up
                times[mode].append(time.perf_counter() - start)
                tokens[mode].append(sum(int(c.token_ids.numel()) for cs in out for c in cs))
    base = statistics.median(times["one call"])
    print(f"\n{'mode':<13} {'s/call':>7} {'vs one call':>11} {'tokens':>7}")
    for mode in modes:
        med = statistics.median(times[mode])
        print(f"{mode:<13} {med:>7.3f} {med / base:>10.2f}x {statistics.fmean(tokens[mode]):>7.0f}")
    print(
        f"{backend_name}: medians of {repeats} interleaved rounds, chunks of {chunk_tokens} "
        "tokens, 1 thread; "
        f"load average {_load(os.getloadavg())}"
    )


def args_recipe() -> str:
    return str(REPO / "recipes" / "demo.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    parser.add_argument("--steps", type=int, default=120, help="training steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="data.seed of each pair")
    parser.add_argument("--variants", nargs="+", default=["demo", "long"], choices=["demo", "long"])
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["batch", "inflight"],
        choices=MODES,
        help="batch: swaps between batches; inflight: between chunks, cache recomputed; "
        "keep: between chunks, cache kept",
    )
    parser.add_argument("--chunk-tokens", type=int, default=8, help="in-flight chunk size")
    parser.add_argument("--eval-prompts", type=int, default=100, help="held-out prompts per eval")
    parser.add_argument("--long-tokens", type=int, default=64, help="max_new_tokens of 'long'")
    parser.add_argument("--long-batch", type=int, default=16, help="prompts per generate, 'long'")
    parser.add_argument("--long-staleness", type=int, default=2, help="max_staleness of 'long'")
    parser.add_argument("--json", default=None, help="also write every run's figures here")
    parser.add_argument("--overhead", metavar="MODEL_DIR", default=None, help="time generate only")
    parser.add_argument("--repeats", type=int, default=20, help="rounds of --overhead")
    parser.add_argument(
        "--backend", default="transformers", choices=["transformers", "vllm"], help="of --overhead"
    )
    args = parser.parse_args()
    if args.overhead:
        overhead(args.overhead, args.chunk_tokens, args.repeats, args.backend)
        return

    variants = variant_overrides(args)
    inflight = [
        "rollout.inflight_updates.enabled=true",
        f"rollout.inflight_updates.chunk_tokens={args.chunk_tokens}",
    ]
    mode_overrides = {
        "batch": [],
        "inflight": inflight,
        "keep": [*inflight, "rollout.inflight_updates.after_swap=keep"],
    }
    modes = args.modes
    runs: dict[str, dict[str, list[dict]]] = {v: {m: [] for m in modes} for v in args.variants}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="zbrl-bench-") as tmp:
        for i, seed in enumerate(args.seeds):
            order = modes[i % len(modes) :] + modes[: i % len(modes)]  # each seed another first
            for variant in args.variants:
                for mode in order:  # interleaved: the modes of a seed see similar load
                    out = Path(tmp) / f"{variant}-{mode}-{seed}"
                    overrides = [
                        *args.overrides,
                        *variants[variant],
                        *mode_overrides[mode],
                        f"data.seed={seed}",
                    ]
                    runs[variant][mode].append(run_once(args, overrides, out))
    load_after = os.getloadavg()

    header = f"{'variant':<8} {'mode':<9} " + " ".join(name for name, _, _ in FIGURES)
    print()
    print(header)
    print("-" * len(header))
    for variant in args.variants:
        for mode in modes:
            cells = [fmt.format(_mean(runs[variant][mode], key)) for _, key, fmt in FIGURES]
            print(f"{variant:<8} {mode:<9} " + " ".join(cells))
    print(
        f"\nmeans over seeds {args.seeds}; {args.steps} steps per run, chunks of "
        f"{args.chunk_tokens} tokens, {args.eval_prompts} held-out prompts per evaluation; "
        f"'long': max_new_tokens={args.long_tokens}, {args.long_batch} prompts per generate call, "
        f"max_staleness={args.long_staleness}"
    )
    print(
        f"load average (1, 5, 15 min) before: {_load(load_before)}, after: {_load(load_after)}; "
        f"{len(os.sched_getaffinity(0))} cores"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))


def _weighted(steps: list[dict], key: str) -> float:
    """Mean of a per-batch mean over the run, weighted by each batch's raw groups."""
    weights = [r.get("raw_groups") or 0 for r in steps]
    total = sum(weights)
    return sum(w * (r.get(key) or 0) for w, r in zip(weights, steps)) / total if total else 0.0


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else float("nan")


def _load(values: tuple[float, float, float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    main()
