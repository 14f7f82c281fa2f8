"""Synchronous (max_staleness = 0) versus asynchronous (max_staleness >= 1) on the same recipe.

Both runs train the same number of samples (same steps, same batch); the table shows wall time,
the idle fraction of each role and the speed-up. Runs one after the other in this process, each
with its own local Ray (loopback only).

    python bench/sync_vs_async.py                       # the demo recipe, 1 producer, 1 consumer
    python bench/sync_vs_async.py --steps 30 --staleness 2 --recipe recipes/demo.yaml key=value
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--steps", type=int, default=24, help="training steps per run")
    parser.add_argument("--staleness", type=int, default=2, help="max_staleness of the async run")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs; medians reported")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    rows: dict[str, list[dict]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory(prefix="zbrl-bench-") as tmp:
        for rep in range(args.repeats):
            for mode, s in (("sync", 0), ("async", args.staleness)):
                out = Path(tmp) / f"{mode}-{rep}"
                rows[mode].append(run_once(args.recipe, args.overrides, s, args.steps, out))

    def med(mode: str, key: str) -> float:
        values = [r[key] for r in rows[mode] if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    header = (
        f"{'mode':<6} {'staleness':>9} {'steps':>5} {'samples':>7} {'wall s':>8} "
        f"{'prod idle':>9} {'cons idle':>9} {'mean stale':>10}"
    )
    print()
    print(header)
    print("-" * len(header))
    for mode, s in (("sync", 0), ("async", args.staleness)):
        print(
            f"{mode:<6} {s:>9} {med(mode, 'steps'):>5.0f} {med(mode, 'samples_trained'):>7.0f} "
            f"{med(mode, 'wall_s'):>8.1f} {med(mode, 'producer_idle_frac'):>9.1%} "
            f"{med(mode, 'consumer_idle_frac'):>9.1%} {med(mode, 'mean_staleness'):>10.2f}"
        )
    speedup = med("sync", "wall_s") / med("async", "wall_s")
    print(f"\nspeed-up (sync wall / async wall, medians of {args.repeats}): {speedup:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "speedup": speedup}, indent=2))


if __name__ == "__main__":
    main()
