"""The tool demo side by side: the same multiplication task with the calculator and without.

Runs ``recipes/demo_tools.yaml`` as it is (episodes with the calculator) and again with
``environment=null`` (one-turn answers; the embedded model's warm start then teaches direct
answers for the same number of steps at most), and prints held-out accuracy before and after RL,
the warm start's steps and the wall time of each run. Each run starts its own local Ray.

    python bench/tools_vs_plain.py                 # the recipe's default steps
    python bench/tools_vs_plain.py --steps 40 key=value ...
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from zbrl.config import load_config
from zbrl.launch.driver import run_training

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "demo_tools.yaml"
VARIANTS = {"with calculator": [], "without tools": ["environment=null"]}


def run_variant(extra: list[str], overrides: list[str], out: Path) -> dict:
    cfg = load_config(
        str(RECIPE),
        [*overrides, *extra, f"logging.run_dir={out}", "logging.progress=false"],
    )
    started = time.perf_counter()
    summary = run_training(cfg)
    summary["wall_s"] = time.perf_counter() - started
    summary["warm_start_steps"] = _warm_start_steps(cfg)
    return summary


def _warm_start_steps(cfg) -> int | None:
    from zbrl.assembly.embedded import embedded_policy_dir
    from zbrl.embedded.warm_start import read_warm_start_summary

    model_dir = embedded_policy_dir(cfg, verbose=False)
    return read_warm_start_summary(model_dir).get("steps_trained")


def table(rows: list[tuple[str, dict]]) -> str:
    lines = [
        "| setting | warm-start steps | held-out acc. before RL | after RL | change | wall (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in rows:
        before, after = s.get("eval_accuracy_initial"), s.get("eval_accuracy_final")
        change = after - before if before is not None and after is not None else None
        lines.append(
            f"| {name} | {s['warm_start_steps']} | {_f(before)} | {_f(after)} | "
            f"{_f(change, sign=True)} | {s['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def _f(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if sign else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="dotted overrides for both runs")
    parser.add_argument("--steps", type=int, default=None, help="training steps (recipe's default)")
    args = parser.parse_args()
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"training.max_steps={args.steps}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="zbrl-tools-bench-") as tmp:
        for name, extra in VARIANTS.items():
            summary = run_variant(extra, overrides, Path(tmp) / name.replace(" ", "_"))
            rows.append((name, summary))
            print(f"[bench] {name}: {json.dumps(_brief(summary))}", flush=True)
    print(table(rows))


def _brief(summary: dict) -> dict:
    keys = ("eval_accuracy_initial", "eval_accuracy_final", "wall_s", "warm_start_steps")
    return {k: summary.get(k) for k in keys}


if __name__ == "__main__":
    main()
