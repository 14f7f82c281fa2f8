"""Scaling of producers x consumers on the embedded model: trained samples per second and each
worker's idle share for 1x1, 2x1, 1x2 and 2x2 (producers x consumers; two consumers train with
``training.engine``, FSDP2 by default, in one gloo group on 127.0.0.1).

Each shape trains the same number of steps of the same recipe, one run after the other, each with
its own local Ray (loopback only). The build machines have 2 cores: with more than two busy
processes they share cores, so this measures the overheads of each shape more than any speed-up;
on a machine with a core (or GPU) per worker the same command shows the scaling.

    python bench/scaling.py                          # demo recipe, 8 steps per shape
    python bench/scaling.py --steps 20 --engine ddp key=value ...
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from zbrl.config import load_config
from zbrl.launch.driver import run_training
from zbrl.telemetry.idle import span_window, worker_utilisation
from zbrl.telemetry.spans import Span

REPO = Path(__file__).resolve().parents[1]
SHAPES = ((1, 1), (2, 1), (1, 2), (2, 2))


def run_shape(args: argparse.Namespace, producers: int, consumers: int, out: Path) -> dict:
    engine = "single" if consumers == 1 else args.engine
    cfg = load_config(
        args.recipe,
        [
            *args.overrides,
            f"launch.num_producers={producers}",
            f"launch.num_consumers={consumers}",
            f"training.engine={engine}",
            f"training.max_steps={args.steps}",
            f"logging.run_dir={out}",
            "logging.progress=false",
            "logging.save_final=false",
            "eval.sets={}",
        ],
    )
    summary = run_training(cfg)
    spans = [Span.from_dict(json.loads(x)) for x in (out / "timeline.jsonl").open()]
    start, end = span_window(spans)
    idle = {w: st.idle_frac for w, st in worker_utilisation(spans, start=start, end=end).items()}
    return {
        "shape": f"{producers}x{consumers}",
        "engine": engine,
        "samples": summary["samples_trained"],
        "wall_s": summary["wall_s"],
        "samples_per_s": summary["samples_trained"] / summary["wall_s"],
        "idle": idle,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    parser.add_argument("--steps", type=int, default=8, help="training steps per shape")
    parser.add_argument("--engine", default="fsdp2", choices=["ddp", "fsdp2"])
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="zbrl-scaling-") as tmp:
        for producers, consumers in SHAPES:
            out = Path(tmp) / f"{producers}x{consumers}"
            rows.append(run_shape(args, producers, consumers, out))

    base = rows[0]["samples_per_s"]
    print(f"\n{args.steps} steps per shape; {os.cpu_count()} CPU cores on this machine")
    header = (
        f"{'shape':<6} {'engine':<7} {'samples':>7} {'wall s':>7} {'samples/s':>9} {'x 1x1':>6}"
    )
    print(header + "  idle share per worker")
    print("-" * (len(header) + 24))
    for r in rows:
        idle = "  ".join(f"{w} {f:.0%}" for w, f in sorted(r["idle"].items()))
        print(
            f"{r['shape']:<6} {r['engine']:<7} {r['samples']:>7} {r['wall_s']:>7.1f} "
            f"{r['samples_per_s']:>9.2f} {r['samples_per_s'] / base:>6.2f}  {idle}"
        )
    print(
        f"\nNote: {os.cpu_count()} cores bound what this can show; shapes with more workers than "
        "cores time-share them, so their samples/s measure overheads, not the scaling a core "
        "(or GPU) per worker gives."
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
