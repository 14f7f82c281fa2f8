"""A short run whose only reward is a reward model on a reward worker placed by Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.runs import WARM_START_STEPS
from zbrl.config import load_config
from zbrl.launch.driver import run_training

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    from zbrl.embedded.reward_model import build_tiny_reward_model, save_reward_model
    from zbrl.embedded.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_tiny_reward_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    return save_reward_model(model, tokenizer, tmp_path_factory.mktemp("rm") / "rm")


def test_producer_scores_on_a_reward_worker(tmp_path, run_cache, rm_dir):
    overrides = [
        f"logging.run_dir={tmp_path / 'run'}",
        f"logging.cache_dir={run_cache}",
        "logging.progress=false",
        f"model.warm_start.steps={WARM_START_STEPS}",
        "data.synthetic.num_train=200",
        "data.synthetic.num_eval=16",
        "eval.max_prompts=8",
        "rollout.generation.max_new_tokens=16",
        "rollout.generation.num_generations=4",
        "rollout.inference_batch_size=2",
        "rollout.inference_microbatch_size=2",
        "training.train_batch_size=2",
        "training.train_microbatch_size=8",
        "training.max_steps=2",
        "logging.log_rollout_interval=1",
        "logging.save_final=false",
        "reward.type=reward_model",
        f"reward.path={rm_dir}",
        "reward.verifier=think_answer_tags",
        "reward.workers=1",
        "reward.worker_num_cpus=0",
    ]
    summary = run_training(load_config(DEMO, overrides))
    run_dir = tmp_path / "run"
    assert summary["steps"] == 2
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    rewards = [r for row in rollouts for r in row["rewards"]]
    # sigmoid scores of the reward model, never the verifier's 0/1 nor the failure reward
    assert rewards and all(0.0 < r < 1.0 for r in rewards)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(m.get("reward_timeouts", 0) for m in metrics) == 0
    assert any("eval_accuracy" in m for m in metrics)
