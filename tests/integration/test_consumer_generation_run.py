"""A short demo run whose idle consumer generates (``rollout.consumers_generate=on``) on a local
Ray: the groups it made are trained (uids ``@c0e<epoch>``, versions it had when it made them),
counted in the step metrics and in the summary's ``consumer_generation``."""

import json
from pathlib import Path

import pytest

from helpers.runs import WARM_START_STEPS
from zbrl.config import load_config
from zbrl.launch.driver import run_training

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


def test_groups_an_idle_consumer_generates_are_trained_and_counted(tmp_path, run_cache):
    cfg = load_config(
        DEMO,
        [
            f"logging.run_dir={tmp_path / 'run'}",
            f"logging.cache_dir={run_cache}",
            "logging.progress=false",
            f"model.warm_start.steps={WARM_START_STEPS}",
            "data.synthetic.num_train=200",
            "eval.sets={}",
            "rollout.consumers_generate=on",
            "rollout.generation.max_new_tokens=16",
            "rollout.generation.num_generations=4",
            "rollout.inference_batch_size=2",
            "rollout.inference_microbatch_size=2",
            "training.train_batch_size=2",
            "training.train_microbatch_size=8",
            "training.max_steps=8",
        ],
    )
    summary = run_training(cfg)
    assert summary["steps"] == 8
    run_dir = Path(summary["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "trained_uids.jsonl").read_text().splitlines()]
    own = [
        (line["step"] - 1, version)
        for line in lines
        for uid, version in zip(line["uids"], line["policy_versions"], strict=True)
        if "@c0e" in uid
    ]
    assert own, "no group the consumer generated was trained"
    assert all(version <= trained_at for trained_at, version in own)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert sum(m["consumer_trained_groups"] for m in steps) == len(own)
    block = summary["consumer_generation"]
    assert block["groups_trained"] == len(own)
    assert block["groups_generated"] >= len(own)
    assert block["steps_generating"] >= 1
