"""A short run with in-flight weight updates on a local Ray: some responses in the rollout log
span two policy versions (``version_changes``), and the per-token staleness reaches the step
metrics and the summary."""

import json
from pathlib import Path

import pytest

from helpers.runs import WARM_START_STEPS, check_rollout_versions
from zbrl.config import load_config
from zbrl.launch.driver import run_training

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


def test_short_run_with_inflight_updates(tmp_path, run_cache):
    cfg = load_config(
        DEMO,
        [
            f"logging.run_dir={tmp_path / 'run'}",
            f"logging.cache_dir={run_cache}",
            "logging.progress=false",
            "logging.log_rollout_interval=1",
            "logging.rollouts_per_log=4",
            f"model.warm_start.steps={WARM_START_STEPS}",
            "data.synthetic.num_train=200",
            "eval.sets={}",
            "rollout.generation.max_new_tokens=24",
            "rollout.generation.num_generations=4",
            "rollout.inference_batch_size=2",
            "rollout.inference_microbatch_size=2",
            "rollout.inflight_updates.enabled=true",
            "rollout.inflight_updates.chunk_tokens=2",
            "training.train_batch_size=2",
            "training.train_microbatch_size=8",
            "training.max_steps=6",
            "transport.max_staleness=2",
        ],
    )
    summary = run_training(cfg)
    assert summary["steps"] == 6
    run_dir = Path(summary["run_dir"])
    check_rollout_versions(run_dir)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert all("token_staleness_mean" in m and "drift_abs_logp" in m for m in steps)
    assert all(m["token_staleness_max"] <= 2 for m in steps)
    assert 0.0 < summary["mean_token_staleness"] <= summary["max_token_staleness"] <= 2
