"""A short multi-turn run on a local Ray: episodes go through producer, buffer and consumer, the
rollout log shows the turns with environment tokens outside the loss, env metrics are logged."""

import json
from pathlib import Path

import pytest

from helpers.runs import WARM_START_STEPS
from zbrl.config import load_config
from zbrl.launch.driver import run_training

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


@pytest.mark.slow  # a whole run; the fast tier checks episodes in process (test_one_rollout_path)
def test_short_multi_turn_run(tmp_path, run_cache):
    cfg = load_config(
        DEMO,
        [
            f"logging.run_dir={tmp_path / 'run'}",
            f"logging.cache_dir={run_cache}",
            "logging.progress=false",
            "logging.log_rollout_interval=1",
            f"model.warm_start.steps={WARM_START_STEPS}",
            "data.synthetic.num_train=200",
            "data.synthetic.num_eval=16",
            "eval.max_prompts=4",
            "rollout.generation.max_new_tokens=12",
            "rollout.generation.num_generations=4",
            "rollout.inference_batch_size=2",
            "rollout.inference_microbatch_size=2",
            "training.train_batch_size=2",
            "training.train_microbatch_size=8",
            "training.max_steps=2",
            "environment={type: 'zbrl.testing.environments:Reply', message_role: user, "
            "limits: {max_turns: 2, max_total_tokens: 40}}",
        ],
    )
    summary = run_training(cfg)
    assert summary["steps"] == 2 and summary["samples_trained"] == 2 * 2 * 4
    run_dir = Path(summary["run_dir"])
    records = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    episodes = [e for r in records for e in r["turns"]]
    assert episodes and all(e[0]["role"] == "model" and e[0]["trained"] for e in episodes)
    env_turns = [t for e in episodes for t in e if t["role"] == "env"]
    assert env_turns and all(
        not t["trained"] and t["text"].endswith("<|assistant|>") for t in env_turns
    )
    for r in records:
        for turns, trained, total in zip(r["turns"], r["trained_tokens"], r["response_tokens"]):
            model = sum(t["end"] - t["start"] for t in turns if t["trained"])
            assert trained == model < total or len(turns) == 1
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert len(steps) == 2 and all(1.0 <= m["env/turns"] <= 2.0 for m in steps)
    evals = (run_dir / "eval" / "2.jsonl").read_text().splitlines()
    assert all("turns" in json.loads(line) for line in evals)
