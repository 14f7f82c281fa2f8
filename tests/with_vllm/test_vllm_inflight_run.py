"""A short run with vLLM rollouts and in-flight weight updates (the producer's receiver swaps
weights into the running engine between engine steps): some responses in the rollout log span
two policy versions, versions only go up inside a response, and the per-token staleness reaches
the summary. With LoRA adapters served by vLLM too (each version replaces the last in place,
under the adapter id the running requests hold), and only the adapters travel."""

from pathlib import Path

import pytest

from helpers.runs import WARM_START_STEPS, check_rollout_versions
from zbrl.config import load_config
from zbrl.launch.driver import run_training

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


LORA = ["model.lora.rank=8", "model.lora.alpha=16", "rollout.backend.lora_mode=adapters"]
FULL_WEIGHTS_BYTES = 2_209_280
"""The embedded model's full weights in the demo's model.dtype (float32; docs/scaling.md, LoRA)."""


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-adapters"])
def test_short_vllm_run_with_inflight_updates(tmp_path, run_cache, lora):
    cfg = load_config(
        DEMO,
        [
            "rollout.backend.type=vllm",
            f"logging.run_dir={tmp_path / 'run'}",
            f"logging.cache_dir={run_cache}",
            "logging.progress=false",
            "logging.log_rollout_interval=1",
            "logging.rollouts_per_log=4",
            f"model.warm_start.steps={WARM_START_STEPS}",
            "data.synthetic.num_train=200",
            "eval.sets={}",
            "rollout.generation.max_new_tokens=24",
            "rollout.inflight_updates.enabled=true",
            "rollout.inflight_updates.chunk_tokens=2",
            "training.max_steps=8",
            "transport.max_staleness=2",
            *(LORA if lora else []),
        ],
    )
    summary = run_training(cfg)
    assert summary["steps"] == 8
    run_dir = Path(summary["run_dir"])
    check_rollout_versions(run_dir)
    assert 0.0 < summary["mean_token_staleness"] <= summary["max_token_staleness"] <= 2
    sent = summary["weight_sync_bytes_per_version"]
    assert (sent < FULL_WEIGHTS_BYTES / 4) if lora else (sent == FULL_WEIGHTS_BYTES)
