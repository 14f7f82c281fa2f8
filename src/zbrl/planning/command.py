"""``zbrl plan RUN_DIR ...``: the planner's command line (arguments, table, JSON, plot)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the parser alone imports neither the planner nor torch
    from zbrl.planning.rates import RunRates
    from zbrl.planning.simulate import Prediction, Shape

DEFAULT_DP_EFFICIENCY = 0.9
"""Assumed parallel efficiency of data-parallel consumers when the measured run had another
number of them (gradient all-reduce and stragglers); ``--dp-efficiency`` overrides it."""
DEFAULT_STEPS = 200


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="predict throughput and idle shares of another shape from a finished run, or "
        "(--memory) the memory each worker of a recipe needs",
        description="An event simulation of the run's own buffer and admission rule, driven by "
        "the rates measured in RUN_DIR (docs/planning.md). Unset options keep the run's values. "
        "With --memory: RUN_DIR is a recipe, and the plan is each worker's memory by part "
        "(docs/memory.md); it exits 1 when the recipe does not fit, naming changes that do.",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR|RECIPE",
        help="a finished run directory (timeline.jsonl, config.yaml, ...); with --memory a recipe",
    )
    p.add_argument(
        "overrides", nargs="*", help="with --memory: dotted overrides (training.engine=fsdp2 ...)"
    )
    p.add_argument(
        "--memory", action="store_true", help="plan the memory of the recipe RUN_DIR|RECIPE"
    )
    p.add_argument(
        "--gpu-gb",
        type=float,
        default=None,
        help="with --memory: memory of one GPU in GiB (80 for an 80 GB card); none: no verdict",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="with --memory: GPUs available (default: as many as the recipe's layout asks)",
    )
    p.add_argument("--producers", type=int, default=None, help="producers N")
    p.add_argument(
        "--consumers",
        type=int,
        default=None,
        help="consumers M (M/C data-parallel slices under the run's context parallelism C)",
    )
    p.add_argument("--staleness", type=int, default=None, help="transport.max_staleness")
    p.add_argument("--batch", type=int, default=None, help="groups per step (train_batch_size)")
    p.add_argument("--group", type=int, default=None, help="completions per prompt")
    p.add_argument(
        "--inference-batch", type=int, default=None, help="groups a producer reserves at once"
    )
    p.add_argument(
        "--weight-sync-s", type=float, default=None, help="override the measured weight sync (s)"
    )
    p.add_argument("--gen-scale", type=float, default=1.0, help="× generation time")
    p.add_argument("--train-scale", type=float, default=1.0, help="× training-step time")
    p.add_argument(
        "--cores", type=int, default=None, help="cores the workers share (default: one each)"
    )
    p.add_argument(
        "--run-cores",
        type=int,
        default=None,
        help="cores the measured run's workers shared: its busy spans become single-core work",
    )
    p.add_argument(
        "--background-load",
        default="0",
        metavar="E|run",
        help="with --cores: other runnable processes sharing the cores (default 0; 'run': the "
        "load measured in the run, needs --run-cores)",
    )
    p.add_argument(
        "--dp-efficiency",
        type=float,
        default=DEFAULT_DP_EFFICIENCY,
        help=f"data-parallel efficiency of M>1 consumers (default {DEFAULT_DP_EFFICIENCY})",
    )
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="simulated steps")
    p.add_argument(
        "--medians",
        action="store_true",
        help="every batch and step takes the median time (default: drawn from the run's spread)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of those draws")
    p.add_argument(
        "--search",
        type=int,
        default=None,
        metavar="TOTAL",
        help="try every split of TOTAL workers into producers + consumers",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", default=None, metavar="PNG", help="with --search: write a plot")
    p.set_defaults(func=run_plan_command)


def shape_from_args(args: argparse.Namespace, rates: RunRates) -> Shape:
    from zbrl.planning.simulate import Shape

    batch = args.batch if args.batch is not None else rates.train_batch_size
    return Shape(
        producers=args.producers if args.producers is not None else rates.num_producers,
        consumers=args.consumers if args.consumers is not None else rates.num_consumers,
        max_staleness=args.staleness if args.staleness is not None else rates.max_staleness,
        train_batch_size=batch,
        group_size=args.group if args.group is not None else rates.group_size,
        inference_batch_size=(
            args.inference_batch if args.inference_batch is not None else rates.inference_batch_size
        ),
        inference_microbatch_size=rates.inference_microbatch_size,
        buffer_capacity=rates.buffer_capacity,
        gen_scale=args.gen_scale,
        train_scale=args.train_scale,
        cores=args.cores,
        background_load=background_from_args(args, rates),
        dp_efficiency=args.dp_efficiency,
        steps=args.steps,
        seed=None if args.medians else args.seed,
    )


def background_from_args(args: argparse.Namespace, rates: RunRates) -> float:
    """``--background-load``: a number of processes, or ``run`` for the run's own (measured)."""
    if args.background_load == "run":
        if rates.background_load is None:
            raise ValueError(
                "--background-load run needs --run-cores and a run whose spans carry their CPU "
                "time (cpu_s)"
            )
        return rates.background_load
    try:
        value = float(args.background_load)
    except ValueError:
        raise ValueError(
            f"--background-load must be a number or 'run', got {args.background_load!r}"
        ) from None
    if value < 0:
        raise ValueError(f"--background-load must be >= 0, got {value}")
    return value


def splits(shape: Shape, total: int, context_parallel_size: int = 1) -> list[Shape]:
    """Every ``producers + consumers == total`` variant of ``shape`` whose consumers form whole
    slices of ``context_parallel_size`` (the measured run's)."""
    if total < context_parallel_size + 1:
        raise ValueError(
            f"--search needs at least {context_parallel_size + 1} workers (a producer and "
            f"{context_parallel_size} consumer(s)), got {total}"
        )
    return [
        replace(shape, producers=p, consumers=total - p)
        for p in range(1, total)
        if (total - p) % context_parallel_size == 0
    ]


def run_plan_command(args: argparse.Namespace) -> int:
    if args.memory:
        from zbrl.planning.memory_command import run_memory_command

        return run_memory_command(args)
    if args.overrides or args.gpu_gb is not None or args.gpus is not None:
        print("error: overrides, --gpu-gb and --gpus go with --memory RECIPE", file=sys.stderr)
        return 1
    from zbrl.planning.rates import RatesError, read_rates
    from zbrl.planning.simulate import simulate

    try:
        rates = read_rates(args.run_dir, args.run_cores)
        if args.weight_sync_s is not None:
            rates = replace(rates, weight_sync_s=args.weight_sync_s, weight_sync_source="given")
        shape = shape_from_args(args, rates)
        if args.plot and args.search is None:
            raise ValueError("--plot needs --search TOTAL (it plots the splits)")
        shapes = (
            splits(shape, args.search, rates.context_parallel_size)
            if args.search is not None
            else [shape]
        )
        predictions = [simulate(rates, s) for s in shapes]
    except (RatesError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    best = max(predictions, key=lambda p: p.samples_per_s)
    if args.plot:
        plot_splits(predictions, Path(args.plot))
    if args.json:
        out: dict = dict(best.as_dict())
        if args.search is not None:
            out["splits"] = [p.as_dict() for p in predictions]
        out["measured"] = rates.measured
        print(json.dumps(out))
        return 0
    print(render(rates, predictions, best if args.search is not None else None))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def render(rates: RunRates, predictions: list[Prediction], best: Prediction | None) -> str:
    """The measured rates, then one row per predicted shape (``*``: the best split)."""
    lines = [
        f"measured in {rates.run_dir} ({rates.num_producers} producer(s) x "
        f"{rates.num_consumers} consumer(s)"
        + (
            f" in slices of context parallelism {rates.context_parallel_size}"
            if rates.context_parallel_size > 1
            else ""
        )
        + f", batch {rates.train_batch_size}x{rates.group_size}"
        + (f", busy rates per core of {rates.run_cores}" if rates.run_cores else "")
        + ")"
    ]
    if rates.background_load is not None:
        lines.append(
            f"  background load during the run: {rates.background_load:.2f} other runnable "
            "processes (from the spans' CPU times)"
        )
    gen = rates.generation
    lines.append(
        f"  generate: {gen.intercept_s * 1e3:.1f} ms + {gen.per_response_s * 1e3:.3f} ms/response"
        + (
            f" ({rates.generation_tokens_per_s:.0f} tokens/s)"
            if rates.generation_tokens_per_s
            else ""
        )
    )
    lines.append(
        f"  score {rates.score_per_response_s * 1e3:.3f} ms/response, push "
        f"{rates.push_per_group_s * 1e3:.2f} ms/group, "
        f"load weights {rates.load_weights_s * 1e3:.1f} ms"
    )
    lines.append(
        f"  train {rates.train_per_group_s * 1e3:.1f} ms/group, step overhead "
        f"{rates.step_overhead_s * 1e3:.1f} ms, weight sync {rates.weight_sync_s * 1e3:.1f} ms "
        f"({rates.weight_sync_source})"
    )
    if rates.response_length_mean is not None:
        lines.append(
            f"  response length mean {rates.response_length_mean:.1f} (per-step p10 "
            f"{rates.response_length_p10:.1f}, p90 {rates.response_length_p90:.1f})"
        )
    m = rates.measured
    if "train_tokens_per_s" in m:
        lines.append(f"  training {m['train_tokens_per_s']:.0f} tokens/s (median over steps)")
    if "samples_per_s" in m:
        lines.append(
            f"  the run itself: {m['samples_per_s']:.1f} samples/s over its whole wall time, idle "
            f"producer {m.get('producer_idle_frac', float('nan')):.0%} consumer "
            f"{m.get('consumer_idle_frac', float('nan')):.0%}"
        )
    if "steady_samples_per_s" in m:
        lines.append(
            f"  its steady state (the prediction's window): {m['steady_samples_per_s']:.1f} "
            f"samples/s, idle producer {m.get('steady_producer_idle_frac', float('nan')):.0%} "
            f"consumer {m.get('steady_consumer_idle_frac', float('nan')):.0%}"
        )
    lines.append("")
    header = (
        "",
        "producers",
        "consumers",
        "staleness",
        "cores",
        "samples/s",
        "steps/s",
        "prod idle",
        "cons idle",
        "mean stale",
    )
    rows = [header]
    for p in predictions:
        s = p.shape
        rows.append(
            (
                "*" if p is best else "",
                str(s.producers),
                str(s.consumers),
                str(s.max_staleness),
                str(s.cores) if s.cores is not None else "own",
                f"{p.samples_per_s:.1f}",
                f"{p.steps_per_s:.2f}",
                f"{p.producer_idle_frac:.0%}",
                f"{p.consumer_idle_frac:.0%}",
                f"{p.mean_staleness:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip())
    if best is not None:
        lines.append(
            f"\nbest split: {best.shape.producers} producer(s) + "
            f"{best.shape.consumers} consumer(s), {best.samples_per_s:.1f} samples/s"
        )
    return "\n".join(lines)


def plot_splits(predictions: list[Prediction], path: Path) -> None:
    """Samples/s and idle shares against the number of producers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p.shape.producers for p in predictions]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(xs, [p.samples_per_s for p in predictions], marker="o")
    a.set_xlabel("producers (the rest consumers)")
    a.set_ylabel("predicted trained samples/s")
    b.plot(xs, [p.producer_idle_frac for p in predictions], marker="o", label="producer idle")
    b.plot(xs, [p.consumer_idle_frac for p in predictions], marker="s", label="consumer idle")
    b.set_xlabel("producers (the rest consumers)")
    b.set_ylabel("idle share")
    b.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
