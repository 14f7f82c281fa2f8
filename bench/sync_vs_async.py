"""Synchronous (max_staleness = 0) versus asynchronous (max_staleness >= 1) on the same recipe.

Every run trains the same number of samples (same steps, same batch): ``sync`` with the recipe's
threads, ``sync-all`` with every core's worth of torch threads in each worker (only one side works
at a time, so each phase may use all cores), ``async``. The table shows wall time,
the idle fraction of each role, and the overlap figures of each run's steady state (see
``zbrl.telemetry.overlap``): ``g`` and ``t``, the producers' and the consumer's busy seconds per
step, the ideal speed-up over a serial loop ``(g + t) / max(g, t)``, the speed-up achieved, and
their ratio ``overlap_efficiency`` (1.0: the slower side never waited). Medians over
``--repeats`` pairs of runs, run one after the other in this process, each with its own local Ray
(loopback only).

    python bench/sync_vs_async.py                       # the demo recipe, 1 producer, 1 consumer
    python bench/sync_vs_async.py --steps 30 --staleness 2 --recipe recipes/demo.yaml key=value
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from zbrl.config import load_config
from zbrl.launch.driver import run_training

REPO = Path(__file__).resolve().parents[1]


def run_once(recipe: str, overrides: list[str], staleness: int, steps: int, out: Path) -> dict:
    cfg = load_config(
        recipe,
        [
            *overrides,
            f"transport.max_staleness={staleness}",
            f"training.max_steps={steps}",
            f"logging.run_dir={out}",
            "logging.progress=false",
            "logging.save_final=false",
            "eval.sets={}",
        ],
    )
    return run_training(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides for both runs")
    parser.add_argument("--steps", type=int, default=40, help="training steps per run")
    parser.add_argument("--staleness", type=int, default=2, help="max_staleness of the async run")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs; medians reported")
    parser.add_argument(
        "--sync-threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="torch threads per worker of the sync-all run (default: every core; 1 skips it)",
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    cores = len(os.sched_getaffinity(0))
    modes = [("sync", 0, [])]
    if args.sync_threads > 1:
        modes.append(("sync-all", 0, [f"launch.torch_threads={args.sync_threads}"]))
    modes.append(("async", args.staleness, []))
    rows: dict[str, list[dict]] = {mode: [] for mode, _, _ in modes}
    with tempfile.TemporaryDirectory(prefix="zbrl-bench-") as tmp:
        for rep in range(args.repeats):
            for mode, s, extra in modes:
                out = Path(tmp) / f"{mode}-{rep}"
                overrides = [*args.overrides, *extra]
                rows[mode].append(run_once(args.recipe, overrides, s, args.steps, out))

    def med(mode: str, key: str) -> float:
        values = [_value(r, key) for r in rows[mode]]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else float("nan")

    header = (
        f"{'mode':<8} {'staleness':>9} {'steps':>5} {'wall s':>7} {'prod idle':>9} "
        f"{'cons idle':>9} {'g s/step':>8} {'t s/step':>8} {'ideal':>6} {'achieved':>8} "
        f"{'efficiency':>10} {'gen frac':>8}"
    )
    print()
    print(header)
    print("-" * len(header))
    for mode, s, _ in modes:
        print(
            f"{mode:<8} {s:>9} {med(mode, 'steps'):>5.0f} {med(mode, 'wall_s'):>7.1f} "
            f"{med(mode, 'producer_idle_frac'):>9.1%} {med(mode, 'consumer_idle_frac'):>9.1%} "
            f"{med(mode, 'generation_s_per_step'):>8.3f} {med(mode, 'training_s_per_step'):>8.3f} "
            f"{med(mode, 'ideal_speedup'):>5.2f}x {med(mode, 'achieved_speedup'):>7.2f}x "
            f"{med(mode, 'overlap_efficiency'):>10.2f} {med(mode, 'producer_generate_frac'):>8.1%}"
        )
    print(
        f"\nsteady state, medians of {args.repeats}: g and t = producer and consumer busy seconds "
        "per step; ideal = (g + t) / max(g, t); achieved = (g + t) / measured seconds per step; "
        "efficiency = achieved / ideal"
    )
    each = ", ".join(f"{_value(r, 'overlap_efficiency'):.2f}" for r in rows["async"])
    print(
        f"async overlap efficiency: {med('async', 'overlap_efficiency'):.2f} of the ideal "
        f"(per repeat: {each})"
    )
    speedup = {}
    for base, _, _ in modes[:-1]:
        ratios = [b["wall_s"] / a["wall_s"] for b, a in zip(rows[base], rows["async"], strict=True)]
        speedup[base] = statistics.median(ratios)
        print(
            f"speed-up over {base} ({base} wall / async wall, median of pairs): "
            f"{speedup[base]:.2f}x"
        )
    sync_ideal = med("sync", "ideal_speedup")
    print(
        f"against the sync run's own g and t (ideal {sync_ideal:.2f}x): "
        f"{speedup['sync'] / sync_ideal:.2f} of it (below the efficiency above when the two sides "
        "slow each other down: on shared cores each side's busy time per step grows once both "
        f"run at once); {cores} cores"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "speedup": speedup}, indent=2))


def _value(summary: dict, key: str) -> float | None:
    """A summary entry, or one of its steady-state overlap figures."""
    if key in summary:
        return summary[key]
    return (summary.get("overlap") or {}).get(key)


if __name__ == "__main__":
    main()
