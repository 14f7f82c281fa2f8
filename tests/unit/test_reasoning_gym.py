"""reasoning-gym as a dataset source and the ``reasoning_gym`` reward; the answer extractions
(``last_number`` shared with the math reward of that name); the evaluator on held-out problems."""

from __future__ import annotations

import pytest
import torch
from role_settings import sampling_params, single_turn

from zbrl.assembly.datasets import check_data_source, load_set_examples, open_dataset_refs
from zbrl.assembly.rewards import build_reward_fn, default_system_prompt
from zbrl.config import ConfigError, load_config
from zbrl.data.dataset import DatasetError
from zbrl.data.reasoning_gym_source import load_reasoning_gym_examples
from zbrl.evaluation.evaluator import EvalSet, evaluate_set
from zbrl.rewards import build_reward
from zbrl.rewards.base import RewardContext
from zbrl.rewards.extraction import answer_tags, boxed, extract_answer, full, last_number
from zbrl.rewards.reasoning_gym import ReasoningGymReward, entry_of
from zbrl.rewards.reasoning_gym_tasks import TaskSpec
from zbrl.rollout.backends.base import Completion
from zbrl.types import EncodedPrompt

ARITHMETIC = (
    "{name: basic_arithmetic, config: {min_terms: 2, max_terms: 2, min_digits: 1, "
    "max_digits: 1, operators: ['+', '-'], allow_parentheses: false, allow_negation: false}}"
)
SOURCE = f"data.source={{type: reasoning_gym, tasks: [{ARITHMETIC}], size: 300, eval_size: 40}}"
RG = [SOURCE, "eval.sets={heldout: held_out}"]
CTX = RewardContext(response_tokens=4, max_new_tokens=24)


def refs_of(cfg):
    """What the training set and each eval set read (no embedded task in these configs)."""
    return open_dataset_refs(cfg).with_task_files(None, None)


def rg_config(*extra):
    return load_config(None, [*RG, "reward.type=reasoning_gym", *extra])


def splits(cfg):
    train, evals = refs_of(cfg)
    return load_set_examples(train, cfg).examples, load_set_examples(evals["heldout"], cfg).examples


def test_train_and_held_out_are_disjoint_deterministic_and_keep_the_entry():
    cfg = rg_config("reward.extract=last_number")
    train, held = splits(cfg)
    assert len(held) == 40
    held_questions = {e.messages[0]["content"] for e in held}
    assert not held_questions & {e.messages[0]["content"] for e in train}
    # the task has 242 distinct problems, so removing the held-out ones costs training problems
    assert 150 < len(train) < 300
    again, _ = splits(cfg)
    assert [e.uid for e in again] == [e.uid for e in train]
    first = train[0]
    question = first.messages[0]["content"]
    a, op, b = question.removeprefix("Calculate ").removesuffix(".").split()
    assert first.gt_answer == str(int(a) + int(b) if op == "+" else int(a) - int(b))
    meta = first.fields["metadata"]
    assert meta["source_dataset"] == "basic_arithmetic" and meta["num_terms"] == 2
    assert entry_of(first.to_example()) == {
        "question": question,
        "answer": first.gt_answer,
        "metadata": meta,
    }


def test_a_mix_of_tasks_draws_from_each():
    tasks = [TaskSpec("basic_arithmetic", 1.0, {"max_terms": 2}), TaskSpec("leg_counting")]
    report = load_reasoning_gym_examples(
        tasks, split="eval", size=10, seed=0, eval_size=30, eval_seed=10_000
    )
    sources = {e.fields["metadata"]["source_dataset"] for e in report.examples}
    assert sources == {"basic_arithmetic", "leg_counting"}


def test_config_refuses_overlapping_seeds_and_source_owned_options():
    with pytest.raises(ConfigError, match=r"seeds \[0, 302\) and the eval seeds \[100, 142\)"):
        load_config(None, [SOURCE.replace("eval_size: 40", "eval_size: 40, eval_seed: 100")])
    with pytest.raises(ConfigError, match="config sets seed, size"):
        load_config(
            None,
            [
                "data.source={type: reasoning_gym, tasks: [{name: leg_counting, config: "
                "{seed: 1, size: 3}}]}",
                "eval.sets={}",
            ],
        )
    with pytest.raises(ConfigError, match="needs the problems of a reasoning-gym source"):
        load_config(None, ["reward.type=reasoning_gym", "eval.sets={}"])
    with pytest.raises(ConfigError, match="eval set\\(s\\) extra are not"):
        load_config(None, [*RG, "reward.type=reasoning_gym", "eval.sets.extra=x.jsonl"])


def test_unknown_task_and_bad_option_name_the_task_and_the_fix():
    cfg = load_config(
        None, ["data.source={type: reasoning_gym, tasks: [basic_arithmetc]}", "eval.sets={}"]
    )
    with pytest.raises(
        DatasetError, match=r"tasks\[0\]: unknown reasoning-gym task .*basic_arithmetic"
    ):
        check_data_source(cfg)
    cfg = load_config(
        None,
        [
            "data.source={type: reasoning_gym, tasks: [{name: basic_arithmetic, config: "
            "{min_terms: 3, max_terms: 2}}]}",
            "eval.sets={}",
        ],
    )
    with pytest.raises(DatasetError, match="max_terms must be >= min_terms"):
        check_data_source(cfg)
    cfg = load_config(
        None,
        [
            "data.source={type: reasoning_gym, tasks: [{name: basic_arithmetic, config: "
            "{digits: 3}}]}",
            "eval.sets={}",
        ],
    )
    with pytest.raises(DatasetError, match=r"refused the task config: .*digits"):
        check_data_source(cfg)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42.", "42"),
        ("5-3=2", "2"),
        ("5 - 3", "3"),
        ("x = -7", "-7"),
        ("\u22124", "-4"),  # unicode minus
        ("total: 1,234.50 dollars", "1234.50"),
        ("about .5", "0.5"),
        ("3 apples and 12 pears", "12"),
        ("no digits here", None),
        ("version2", None),
    ],
)
def test_last_number(text, expected):
    assert last_number(text) == expected


def test_other_extractions():
    assert answer_tags("<answer> 1 </answer> then <answer>\n7\n</answer>") == "7"
    assert answer_tags("<answer> </answer>") is None and answer_tags("7") is None
    assert full("  8 \n") == "8" and full(" \n") is None
    assert boxed("so \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}" and boxed("1/2") is None
    assert extract_answer("a 3", "last_number") == "3"
    with pytest.raises(ValueError, match="unknown answer extraction 'tags'"):
        extract_answer("x", "tags")


def test_reasoning_gym_reward_scores_with_the_tasks_own_scorer():
    cfg = rg_config("reward.extract=last_number", "reward.timeout_s=5")
    _, held = splits(cfg)
    reward = build_reward_fn(cfg)
    assert isinstance(reward, ReasoningGymReward) and reward.extract == "last_number"
    reward.timeout_s = None  # in-process here; the deadline path is tested below
    ex = held[0].to_example()
    gold = ex["gt_answer"]
    results = reward.score_batch(
        [f"{gold}", f"I think it is {gold}", "I think it is 99", "no idea"],
        [ex] * 4,
        [CTX] * 4,
    )
    assert [r.ans_acc for r in results] == [1.0, 1.0, 0.0, 0.0]
    assert [r.reward for r in results] == [1.0, 1.0, 0.0, 0.0]
    assert [r.format_acc for r in results] == [1.0, 1.0, 1.0, 0.0]
    assert results[3].metadata["reason"] == "no answer (last_number)"
    # the base scorer gives partial credit when the gold answer is inside the extracted one
    partial = ReasoningGymReward(extract="full", timeout_s=None, wrong_reward=-1.0)
    (result,) = partial.score_batch([f"{gold} or so"], [ex], [CTX])
    share = len(gold) / len(f"{gold} or so")
    assert result.ans_acc == pytest.approx(share)
    assert result.reward == pytest.approx(-1.0 + 2.0 * share)


def test_reasoning_gym_reward_under_a_deadline_in_a_worker_process():
    cfg = rg_config("reward.extract=answer_tags")
    _, held = splits(cfg)
    reward = build_reward_fn(cfg)
    ex = held[1].to_example()
    try:
        results = reward.score_batch(
            [f"<answer>{ex['gt_answer']}</answer>", "<answer>1000</answer>"], [ex] * 2, [CTX] * 2
        )
    finally:
        reward._pool.shutdown()
    assert [r.ans_acc for r in results] == [1.0, 0.0]
    assert not any(r.timed_out for r in results)


def test_reasoning_gym_reward_refuses_other_examples():
    reward = ReasoningGymReward(timeout_s=None)
    example = {"messages": [{"role": "user", "content": "1+1?"}], "gt_answer": "2", "fields": {}}
    with pytest.raises(ValueError, match="no reasoning-gym metadata"):
        reward.score_batch(["<answer>2</answer>"], [example], [CTX])


def test_system_prompt_follows_the_extraction():
    assert default_system_prompt(rg_config("reward.extract=last_number")).endswith("as a number.")
    assert "<answer>" in default_system_prompt(rg_config())
    ours = rg_config("data.system_prompt='Answer with only the final number.'")
    assert ours.data.system_prompt == "Answer with only the final number."


def test_last_number_math_reward_uses_the_same_extractor():
    reward = build_reward("last_number", timeout_s=None)
    ex = {"gt_answer": "0.5"}
    results = reward.score_batch(["so 1/2 = 0.50", "It is 5", "none"], [ex] * 3, [CTX] * 3)
    assert [r.parsed for r in results] == ["0.50", "5", None]
    assert [r.ans_acc for r in results] == [1.0, 0.0, 0.0]
    assert [r.format_acc for r in results] == [1.0, 1.0, 0.0]
    cfg = load_config(None, ["reward.type=last_number", "reward.correct_reward=2"])
    assert build_reward_fn(cfg).correct_reward == 2.0
    with pytest.raises(ConfigError, match="format_tags"):
        load_config(None, ["reward.type=last_number", "reward.format_tags=[x]"])


class EchoBackend:
    """Greedy-like stub: answers prompt i with ``texts[i]``."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, params):
        return [
            [Completion(torch.ones(2, dtype=torch.long), torch.zeros(2), self.texts[p[0]], "stop")]
            for p in prompts
        ]


def test_evaluator_scores_held_out_problems_with_the_reasoning_gym_reward():
    cfg = rg_config("reward.extract=last_number")
    _, held = splits(cfg)
    prompts = [EncodedPrompt(e.uid, [i], e.to_example()) for i, e in enumerate(held[:4])]
    texts = [f"It is {e.gt_answer}" for e in held[:3]] + ["It is 1000"]  # 3 of 4 right
    reward = build_reward_fn(cfg)
    reward.timeout_s = None
    params = sampling_params(n=1, temperature=0.0, max_new_tokens=24)
    metrics, records = evaluate_set(
        EchoBackend(texts),
        single_turn(params),
        reward,
        EvalSet("heldout", prompts),
        params,
        batch_size=2,
    )
    assert metrics["accuracy"] == pytest.approx(0.75)
    assert metrics["num_prompts"] == 4.0
    assert [r["ans_valid"] for r in records] == [True, True, True, False]
    assert records[0]["gold"] == held[0].gt_answer and records[0]["parsed"] == held[0].gt_answer
