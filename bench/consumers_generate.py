"""Idle consumers generate, off against auto: each recipe trained with
``rollout.consumers_generate=off`` and then ``=auto``, one run after the other, as
``zbrl train`` runs them (its own local Ray each). Prints, per run, the summary's idle shares,
wall time and held-out gain, and what the consumer generated with the planner's predicted idle
beside the measured one; then the auto/off ratios. A busy machine says so under the table.

    python bench/consumers_generate.py                          # demo and agent demo
    python bench/consumers_generate.py --recipes recipes/demo.yaml --modes off on auto
    python bench/consumers_generate.py --set training.max_steps=100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from machine_load import load_line

REPO = Path(__file__).resolve().parents[1]
RECIPES = ["recipes/demo.yaml", "recipes/demo_agent.yaml"]


def run(recipe: str, mode: str, out: Path, extra: list[str]) -> dict:
    run_dir = out / f"{Path(recipe).stem}-{mode}"
    cmd = [
        str(REPO / ".venv" / "bin" / "zbrl"),
        "train",
        recipe,
        f"rollout.consumers_generate={mode}",
        f"logging.run_dir={run_dir}",
        "logging.progress=false",
        *extra,
    ]
    started = time.time()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["command_s"] = time.time() - started
    return summary


def row(recipe: str, mode: str, s: dict) -> list[str]:
    gen = s.get("consumer_generation") or {}
    initial, final = s["eval_accuracy_initial"], s["eval_accuracy_final"]
    gain = final - initial if initial is not None and final is not None else None
    planned = gen.get("planned_consumer_idle")
    return [
        Path(recipe).stem,
        mode,
        f"{s['producer_idle_frac']:.1%}",
        f"{s['consumer_idle_frac']:.1%}",
        "-" if planned is None else f"{planned:.1%}",
        f"{s['wall_s']:.0f}",
        "-" if gain is None else f"{gain:+.3f}",
        str(gen.get("groups_trained", 0)),
        str(gen.get("steps_generating", 0)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=RECIPES)
    parser.add_argument("--modes", nargs="+", default=["off", "auto"])
    parser.add_argument("--out", default="runs/bench-consumers-generate")
    parser.add_argument("--set", nargs="*", default=[], help="extra dotted overrides")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    before = os.getloadavg()
    header = [
        "recipe",
        "mode",
        "prod idle",
        "cons idle",
        "planned",
        "wall s",
        "gain",
        "own groups",
        "gen steps",
    ]
    rows, summaries = [], {}
    for recipe in args.recipes:
        for mode in args.modes:
            summaries[recipe, mode] = s = run(recipe, mode, out, args.set)
            rows.append(row(recipe, mode, s))
            print(" | ".join(rows[-1]), flush=True)
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    base = args.modes[0]
    for recipe in args.recipes:
        for mode in args.modes[1:]:
            a, b = summaries[recipe, mode], summaries[recipe, base]
            print(f"{Path(recipe).stem}: {mode}/{base} wall time {a['wall_s'] / b['wall_s']:.2f}")
    print(load_line(before, os.getloadavg()))


if __name__ == "__main__":
    main()
