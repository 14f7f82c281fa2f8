"""The embedded reward model at several training budgets and objectives: held-out figures and
build time, then (optionally) the RL demo on each reward model, true held-out accuracy by step.

    python bench/reward_model_sweep.py --objectives likelihood --rl-steps 300 --seeds 0 1 2
    python bench/reward_model_sweep.py --steps 600 8000 --objectives pairwise tokenwise
    python bench/reward_model_sweep.py --steps 8000 --objectives tokenwise --rl-steps 300

``likelihood`` (the default objective, :mod:`zbrl.rewards.likelihood_verifier`) fits a two-feature
head and has no step budget: it is built once per seed whatever ``--steps`` says.

The classifier trains on a GPU when one is visible (sampling stays on the CPU); the RL runs use
recipes/demo_reward_model.yaml with ``reward.path`` set to each classifier's directory, so
``eval_accuracy`` is the verifier's (true) accuracy. Figures are printed as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "demo_reward_model.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[600, 8000])
    parser.add_argument("--objectives", nargs="+", default=["likelihood", "pairwise", "tokenwise"])
    parser.add_argument("--lr", type=float, default=None, help="default: 5e-4 (1e-3 tokenwise)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--backbone-sft-steps", type=int, default=None, help="default: ensure_reward_model's"
    )
    parser.add_argument("--cache", default=".cache/zbrl")
    parser.add_argument("--rl-steps", type=int, default=0, help="0: no RL runs")
    parser.add_argument("--out", default="/tmp/zbrl-rm-sweep")
    args = parser.parse_args()

    from zbrl.assembly.embedded import embedded_policy_dir
    from zbrl.config import load_config
    from zbrl.embedded.reward_model import ensure_reward_model, read_reward_model_summary

    for seed in args.seeds:
        cfg = load_config(RECIPE, [f"seed={seed}", f"logging.cache_dir={args.cache}"])
        policy = embedded_policy_dir(cfg)
        for objective in args.objectives:
            budgets = args.steps[:1] if objective == "likelihood" else args.steps
            for steps in budgets:
                lr = (
                    args.lr if args.lr is not None else (1e-3 if objective == "tokenwise" else 5e-4)
                )
                started = time.perf_counter()
                more = {}
                if args.backbone_sft_steps is not None:
                    more["backbone_sft_steps"] = args.backbone_sft_steps
                built = ensure_reward_model(
                    args.cache, policy, seed=seed, objective=objective, steps=steps, lr=lr, **more
                )
                summary = read_reward_model_summary(built)
                took = round(time.perf_counter() - started, 1)
                row = {"seed": seed, "objective": objective, "steps": steps, "lr": lr,
                       "dir": str(built), "seconds": took, **summary["heldout"]}  # fmt: skip
                print(json.dumps(row), flush=True)
                if args.rl_steps:
                    rl = rl_run(args, built, objective, steps, seed)
                    print(json.dumps({**row, "rl": rl}), flush=True)


def rl_run(args: argparse.Namespace, rm_dir: Path, objective: str, steps: int, seed: int) -> dict:
    run_dir = Path(args.out) / f"rl-{objective}-{steps}-b{args.backbone_sft_steps}-s{seed}"
    overrides = [
        f"seed={seed}", f"logging.cache_dir={args.cache}", f"logging.run_dir={run_dir}",
        f"reward.path={rm_dir}", f"training.max_steps={args.rl_steps}", "logging.progress=false",
        f"eval.interval={max(1, args.rl_steps // 4)}",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "zbrl.cli", "train", str(RECIPE), *overrides]
    code = subprocess.call(cmd, stdout=subprocess.DEVNULL)
    evals = {}
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        m = json.loads(line)
        if "eval_accuracy" in m:
            evals[m.get("step", -1)] = m["eval_accuracy"]
    return {"exit": code, "eval_accuracy": evals}


if __name__ == "__main__":
    main()
