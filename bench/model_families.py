"""Three demo steps on a tiny model of each family, packed and not: a table of the exit code,
whether a run directory was made, the first step's ``mismatch_abs_logp`` and the router loss.

    .venv/bin/python bench/model_families.py [--out /tmp/zbrl-families] [--families ...]

The model directories come from :mod:`zbrl.testing.model_families` (plus a tiny Llama, the
embedded model's architecture with random weights, as the reference); each run is
``zbrl train recipes/demo.yaml model.path=DIR data.allow_embedded_task_with_user_model=true
training.max_steps=3`` with ``training.packing`` false and true.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from zbrl.embedded.tiny_model import create_embedded_model
from zbrl.testing.model_families import FAMILIES, create_family_dir

REPO = Path(__file__).resolve().parents[1]


def run(model_dir: Path, run_dir: Path, packing: bool) -> dict:
    overrides = [
        f"model.path={model_dir}",
        "data.allow_embedded_task_with_user_model=true",
        "training.max_steps=3",
        f"training.packing={'true' if packing else 'false'}",
        f"logging.run_dir={run_dir}",
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "zbrl.cli",
            "train",
            str(REPO / "recipes" / "demo.yaml"),
            *overrides,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    rows = []
    if (run_dir / "metrics.jsonl").is_file():
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    mismatch = [r["mismatch_abs_logp"] for r in rows if "mismatch_abs_logp" in r]
    aux = [r["router_aux_loss"] for r in rows if "router_aux_loss" in r]
    errors = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    return {
        "rc": done.returncode,
        "run_dir": run_dir.exists(),
        "mismatch": f"{mismatch[0]:.1e}" if mismatch else "-",
        "aux": f"{aux[0]:.3f}" if aux else "-",
        "error": errors[0][:90] if errors else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/zbrl-families"))
    parser.add_argument("--families", nargs="+", default=["llama", *FAMILIES])
    args = parser.parse_args()
    models, runs = args.out / "models", args.out / "runs"
    print(f"{'family':<14}{'packing':<9}{'rc':<4}{'run dir':<9}{'mismatch':<10}{'aux':<7}error")
    for family in args.families:
        model_dir = models / family
        if not (model_dir / "config.json").is_file():
            if family == "llama":
                create_embedded_model(model_dir, seed=0)
            else:
                create_family_dir(family, model_dir)
        for packing in (False, True):
            r = run(model_dir, runs / f"{family}-{'packed' if packing else 'plain'}", packing)
            print(
                f"{family:<14}{packing!s:<9}{r['rc']:<4}{r['run_dir']!s:<9}"
                f"{r['mismatch']:<10}{r['aux']:<7}{r['error']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
