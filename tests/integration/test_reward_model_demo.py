"""The reward-model demo end to end (minutes on 2 cores): RL whose only reward is the embedded
reward model raises the TRUE held-out accuracy (the evaluator scores with the verifier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zbrl.config import load_config
from zbrl.launch.driver import run_training

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo_reward_model.yaml"


@pytest.mark.xfail(
    strict=True,
    reason="not reached yet: the embedded reward model (held-out AUC 0.63-0.72) is exploited "
    "within 100 steps and true accuracy falls (docs/rewards.md, the reward-model demo)",
)
def test_rl_on_the_reward_model_alone_raises_true_accuracy(tmp_path, run_cache):
    overrides = [
        f"logging.run_dir={tmp_path / 'run'}",
        f"logging.cache_dir={run_cache}",
        "logging.progress=false",
    ]
    summary = run_training(load_config(RECIPE, overrides))
    assert summary["steps"] == 300
    assert summary["eval_accuracy_final"] - summary["eval_accuracy_initial"] >= 0.10
