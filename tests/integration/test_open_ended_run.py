"""Issue 30's done-when: a 3-step run on a JSONL of open-ended prompts (no ``gt_answer``) with a
remote reward ends with exit status 0; the service received every item without an answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flaky_reward_server import FlakyRewardServer, length_scorer
from helpers.cli_process import finish, start, tiny_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"
TOPICS = ["rain", "a cat", "the sea", "bread", "a clock", "snow", "a bridge", "tea"]


def test_open_ended_prompts_train_with_a_remote_reward(tmp_path, run_cache):
    prompts = tmp_path / "open_ended.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"Say something about {t}."}],
                        "topic": t}) + "\n"
            for t in TOPICS
        )
    )  # fmt: skip
    service = FlakyRewardServer(length_scorer)
    run_dir = tmp_path / "run"
    try:
        args = [
            *tiny_run(run_dir, run_cache, steps=3, staleness=1),
            f"data.train_path={prompts}",
            "reward.type=http",
            f"reward.url={service.url}",
        ]
        proc, stderr = start(tmp_path, "run", "train", str(DEMO), *args)
        code, err = finish(proc, stderr)
    finally:
        service.stop()
    assert code == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3
    assert summary["reward_failed_responses"] == 0
    assert service.items and all(i["gt_answer"] is None for i in service.items)
    assert {i["fields"]["topic"] for i in service.items} <= set(TOPICS)
