"""The synthetic arithmetic task: deterministic, held-out split disjoint, reference completions."""

from __future__ import annotations

import json

import pytest

from zbrl.embedded.addition_task import (
    SYSTEM_PROMPT,
    extract_answer,
    make_arithmetic_rows,
    make_row,
    parse_problem,
    problem_split,
    reference_completion,
    think_steps,
    write_task,
)


def _problems(rows):
    return {parse_problem(r) for r in rows}


def test_same_seed_same_rows_and_other_seed_other_rows():
    a = make_arithmetic_rows(50, seed=7)
    b = make_arithmetic_rows(50, seed=7)
    c = make_arithmetic_rows(50, seed=8)
    assert a == b
    assert a != c


def test_write_task_is_deterministic(tmp_path):
    first = write_task(tmp_path / "a", n_train=40, n_eval=10, seed=3)
    second = write_task(tmp_path / "b", n_train=40, n_eval=10, seed=3)
    for p, q in zip(first, second):
        assert p.read_bytes() == q.read_bytes()


def test_rows_have_the_conversation_jsonl_format(tmp_path):
    train_path, eval_path = write_task(tmp_path, n_train=30, n_eval=10, seed=0)
    for path, n in ((train_path, 30), (eval_path, 10)):
        lines = path.read_text().splitlines()
        assert len(lines) == n
        for line in lines:
            row = json.loads(line)
            assert set(row) == {"messages", "gt_answer"}
            assert [m["role"] for m in row["messages"]] == ["system", "user"]
            assert all(set(m) == {"role", "content"} for m in row["messages"])
            assert all(isinstance(m["content"], str) and m["content"] for m in row["messages"])
            assert row["messages"][0]["content"] == SYSTEM_PROMPT
            a, b = parse_problem(row)
            assert row["gt_answer"] == str(a + b)


def test_task_files_load_with_the_dataset_loader(tmp_path):
    dataset = pytest.importorskip("zbrl.data.dataset")
    train_path, eval_path = write_task(tmp_path, n_train=20, n_eval=5, seed=1)
    assert len(dataset.load_examples(train_path, answer_field="gt_answer").examples) == 20
    assert len(dataset.load_examples(eval_path, answer_field="gt_answer").examples) == 5


def test_problems_are_distinct_within_a_split():
    rows = make_arithmetic_rows(2000, seed=0, split="train")
    assert len(_problems(rows)) == 2000


@pytest.mark.parametrize("seed", [0, 1, 1234])
def test_held_out_split_is_disjoint_from_train_for_any_seed_and_size(tmp_path, seed):
    train_path, eval_path = write_task(tmp_path, n_train=3000, n_eval=300, seed=seed)
    train = [json.loads(x) for x in train_path.read_text().splitlines()]
    held_out = [json.loads(x) for x in eval_path.read_text().splitlines()]
    assert not _problems(train) & _problems(held_out)
    # The split is a fixed partition of the problem space: train rows made with any other seed
    # (e.g. the warm start's) never contain a held-out problem either.
    other_train = make_arithmetic_rows(3000, seed=seed + 99, split="train")
    assert not _problems(other_train) & _problems(held_out)
    assert all(problem_split(a, b) == "eval" for a, b in _problems(held_out))


def test_asking_for_more_problems_than_exist_is_a_clear_error():
    with pytest.raises(ValueError, match="distinct"):
        make_arithmetic_rows(500, seed=0, max_digits=1, split="eval")


def test_think_steps_show_column_addition_with_carries():
    assert think_steps(37, 48) == "7+8=15,3+4+1=8"
    assert think_steps(5, 48) == "5+8=13,0+4+1=5"
    assert think_steps(99, 1) == "9+1=10,9+0+1=10"
    assert think_steps(0, 0) == "0+0=0"


def test_reference_completion_example():
    row = make_row(37, 48)
    assert reference_completion(row) == "<think>7+8=15,3+4+1=8</think><answer>85</answer>"


def test_reference_completion_answer_equals_gt_answer():
    for row in make_arithmetic_rows(300, seed=5, min_digits=1, max_digits=3):
        completion = reference_completion(row)
        assert completion.startswith("<think>")
        assert completion.endswith("</answer>")
        assert extract_answer(completion) == row["gt_answer"]


def test_reference_completion_scores_full_reward_with_the_project_reward():
    rewards = pytest.importorskip("zbrl.rewards.think_answer")
    from zbrl.rewards.base import RewardContext

    reward = rewards.ThinkAnswerReward()
    ctx = RewardContext(response_tokens=20, max_new_tokens=32)
    for row in make_arithmetic_rows(5, seed=2):
        result = reward.score(reference_completion(row), row, ctx)
        assert result.format_acc == 1.0
        assert result.ans_acc == 1.0
        wrong = reference_completion(row).replace(
            f"<answer>{row['gt_answer']}</answer>", f"<answer>{int(row['gt_answer']) + 1}</answer>"
        )
        assert reward.score(wrong, row, ctx).ans_acc == 0.0
