"""Open-ended prompts (issue 30): rewards that need no answer load lines without ``gt_answer``;
a reward that needs one names itself, the file and the line when a line has none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zbrl.assembly.datasets import load_set_examples
from zbrl.config import RunConfig
from zbrl.data.dataset import DatasetError

URL = "http://127.0.0.1:9/score"


def _jsonl(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows() -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": "Write a haiku about rain."}], "topic": "rain"},
        {"messages": [{"role": "user", "content": "2+2?"}], "gt_answer": "4"},
        {"messages": [{"role": "user", "content": "Describe a cat."}]},
    ]


@pytest.mark.parametrize(
    "reward",
    [
        {"type": "http", "url": URL},
        {"type": "reward_model", "path": "embedded"},
        {"type": "llm_judge", "path": "embedded"},
        {"type": "zbrl.testing.faults:sleeping_reward", "answer_field": "none"},
    ],
    ids=["http", "reward_model", "llm_judge", "user_none"],
)
def test_rewards_that_need_no_answer_load_open_ended_lines(tmp_path, reward):
    cfg = RunConfig.model_validate({"reward": reward})
    report = load_set_examples(_jsonl(tmp_path, _rows()), cfg)
    examples = [e.to_example() for e in report.examples]
    assert [e["gt_answer"] for e in examples] == [None, "4", None]  # a given answer still passes
    assert examples[0]["fields"] == {"topic": "rain"}


def test_an_environment_that_scores_itself_needs_no_answer(tmp_path):
    cfg = RunConfig.model_validate({"environment": {"type": "tools", "score_final_turn": False}})
    report = load_set_examples(_jsonl(tmp_path, _rows()), cfg)
    assert len(report.examples) == 3


@pytest.mark.parametrize(
    ("reward", "who"),
    [
        ({"type": "think_answer_tags"}, "the reward 'think_answer_tags' scores against it"),
        ({"type": "boxed"}, "the reward 'boxed' scores against it"),
        (
            {"type": "http", "url": URL, "verifier": "think_answer_tags"},
            "reward.verifier 'think_answer_tags' (the accuracy metrics and evaluations) scores",
        ),
        (
            {"type": "http", "url": URL, "extra": [{"type": "boxed"}]},
            "the extra reward 'boxed' scores against it",
        ),
    ],
    ids=["think_answer_tags", "boxed", "verifier", "extra"],
)
def test_a_missing_answer_names_the_reward_the_file_and_the_line(tmp_path, reward, who):
    path = _jsonl(tmp_path, _rows())
    cfg = RunConfig.model_validate({"reward": reward})
    with pytest.raises(DatasetError) as info:
        load_set_examples(path, cfg)
    message = str(info.value)
    assert message.startswith(f"{path} line 1: 'gt_answer' is missing; {who}")
    assert "or needs no answer" in message
    assert info.value.line == 1
