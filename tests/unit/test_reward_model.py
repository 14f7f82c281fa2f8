"""Reward models: the scorer against one-by-one scoring, the reward's deadline and failure paths,
and the config path (primary reward, extra reward, evaluation reward)."""

from __future__ import annotations

import math
import time

import pytest

from zbrl.rewards.base import RewardContext
from zbrl.rewards.reward_model import ClassifierReward, RewardModelScorer, render_pair

CTX = RewardContext(response_tokens=3, max_new_tokens=8)
PROMPT = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    from zbrl.embedded.reward_model import build_tiny_reward_model, save_reward_model
    from zbrl.embedded.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_tiny_reward_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=1)
    return save_reward_model(model, tokenizer, tmp_path_factory.mktemp("rm") / "rm")


def test_batched_scores_equal_one_by_one_scores(rm_dir):
    raw = RewardModelScorer(rm_dir, batch_size=3, normalize="none")
    responses = ["5", "<think>2+3</think><answer>5</answer>", "six", "", "12345678"]
    batched = raw.score([PROMPT] * 5, responses)
    single = [raw.score([PROMPT], [r])[0] for r in responses]
    assert batched == pytest.approx(single, abs=1e-5)  # right padding does not move the score
    assert len(set(round(s, 5) for s in batched)) > 1
    probs = RewardModelScorer(rm_dir, batch_size=2).score([PROMPT] * 5, responses)
    assert probs == pytest.approx([1 / (1 + math.exp(-s)) for s in batched], abs=1e-5)


def test_render_pair_puts_the_response_in_the_assistant_turn(rm_dir):
    from transformers import AutoTokenizer

    text = render_pair(AutoTokenizer.from_pretrained(rm_dir), PROMPT, "RESPONSE-X")
    assert text.index("What is 2+3?") < text.index("RESPONSE-X")

    class Plain:
        chat_template = None

    assert render_pair(Plain(), PROMPT, "7") == "user: What is 2+3?\nassistant: 7"


class FixedScorer:
    def __init__(self, scores=None, delay_s=0.0, error=None):
        self.scores, self.delay_s, self.error, self.calls = scores, delay_s, error, []

    def score(self, prompts, responses):
        self.calls.append((prompts, responses))
        time.sleep(self.delay_s)
        if self.error:
            raise self.error
        return self.scores[: len(responses)]


def _examples(n):
    return [{"messages": PROMPT, "gt_answer": "5"}] * n


def test_reward_is_the_score_sent_in_one_batch():
    scorer = FixedScorer([0.25, 0.75, 2.0])
    reward = ClassifierReward(scorer)
    results = reward.score_batch(["a", "b", "c"], _examples(3), [CTX] * 3)
    assert [r.reward for r in results] == [0.25, 0.75, 2.0]
    assert [r.ans_acc for r in results] == [0.25, 0.75, 1.0]
    assert len(scorer.calls) == 1 and scorer.calls[0] == ([PROMPT] * 3, ["a", "b", "c"])


def test_a_verifier_sets_accuracy_but_not_the_reward():
    from zbrl.rewards.registry import build_reward

    reward = ClassifierReward(FixedScorer([0.1, 0.9]), verifier=build_reward("think_answer_tags"))
    right = "<think>2+3</think><answer>5</answer>"
    results = reward.score_batch([right, "<think></think><answer>4</answer>"], _examples(2),
                                 [CTX] * 2)  # fmt: skip
    assert [r.reward for r in results] == [0.1, 0.9]
    assert [r.ans_acc for r in results] == [1.0, 0.0]


def test_failures_and_deadlines_are_counted_not_raised():
    broken = ClassifierReward(FixedScorer(error=RuntimeError("worker died")))
    results = broken.score_batch(["a", "b"], _examples(2), [CTX] * 2)
    assert all(r.failed and math.isnan(r.reward) for r in results)  # no score, never a number
    assert "worker died" in results[0].metadata["reward_error"] and broken.failures == 1

    slow = ClassifierReward(FixedScorer([0.5], delay_s=0.5), timeout_s=0.05)
    start = time.monotonic()
    (late,) = slow.score_batch(["a"], _examples(1), [CTX])
    assert time.monotonic() - start < 0.4
    assert late.failed and "within 0.05 s" in late.metadata["reward_error"]

    wrong = ClassifierReward(FixedScorer([float("nan")]))
    assert wrong.score("a", _examples(1)[0], CTX).failed


def test_config_builds_primary_extra_and_eval_rewards(rm_dir):
    from zbrl.assembly.rewards import build_eval_reward_fn, build_reward_fn, check_reward
    from zbrl.config import ConfigError, RunConfig
    from zbrl.rewards.combine import CombinedReward
    from zbrl.rewards.think_answer import ThinkAnswerReward

    cfg = RunConfig.model_validate(
        {"reward": {"type": "reward_model", "path": str(rm_dir), "verifier": "think_answer_tags",
                    "batch_size": 2}}
    )  # fmt: skip
    check_reward(cfg)
    reward = build_reward_fn(cfg)
    assert isinstance(reward, ClassifierReward) and reward.scorer.batch_size == 2
    assert isinstance(build_eval_reward_fn(cfg), ThinkAnswerReward)
    (result,) = reward.score_batch(["<think></think><answer>5</answer>"], _examples(1), [CTX])
    assert 0 < result.reward < 1 and result.ans_acc == 1.0

    mixed = RunConfig.model_validate(
        {"reward": {"type": "think_answer_tags",
                    "extra": [{"type": "reward_model", "weight": 0.5,
                               "options": {"path": str(rm_dir)}}]}}
    )  # fmt: skip
    combined = build_reward_fn(mixed)
    assert isinstance(combined, CombinedReward)
    (r,) = combined.score_batch(["<think></think><answer>5</answer>"], _examples(1), [CTX])
    rm_score = r.metadata["component_rewards"]["reward_model"]
    assert r.reward == pytest.approx(1.0 + 0.5 * rm_score)

    missing = RunConfig.model_validate({"reward": {"type": "reward_model", "path": "/nope/rm"}})
    with pytest.raises(Exception, match=r"reward\.path='/nope/rm' does not exist"):
        check_reward(missing)
    with pytest.raises(ConfigError, match="cannot take options"):
        check_reward(RunConfig.model_validate(
            {"reward": {"type": "think_answer_tags",
                        "extra": [{"type": "reward_model", "options": {"pth": "x"}}]}}
        ))  # fmt: skip


def test_counterfactual_pairs_differ_only_in_the_answer():
    from zbrl.embedded.reward_model import _with_counterfactuals

    row = {"messages": PROMPT, "gt_answer": "5"}
    rows, responses = _with_counterfactuals(
        [row, row], ["<think>2+3=4</think><answer>4</answer>", "no answer"], seed=0
    )
    assert responses[:2] == ["<think>2+3=4</think><answer>4</answer>", "no answer"]
    assert responses[2] == "<think>2+3=4</think><answer>5</answer>"
    wrong = responses[3].removeprefix("<think>2+3=4</think><answer>").removesuffix("</answer>")
    assert int(wrong) != 5
    assert len(rows) == len(responses) == 4  # the response without an answer gets no copies


def test_held_out_figures():
    import torch

    from zbrl.embedded.reward_model import held_out_figures

    figures = held_out_figures(torch.tensor([2.0, -1.0, 0.5, -3.0]), [1.0, 0.0, 0.0, 0.0])
    assert figures == {"pairs": 4, "positive_rate": 0.25, "accuracy": 0.75, "auc": 1.0}


def test_embedded_reward_model_is_trained_once_and_cached(tmp_path, tiny_model_dir):
    from zbrl.embedded.reward_model import ensure_reward_model, read_reward_model_summary

    small = {"n_prompts": 4, "samples_per_prompt": 2, "steps": 2, "batch_size": 4,
             "eval_prompts": 3, "max_new_tokens": 8, "backbone_sft_steps": None,
             "objective": "pointwise"}  # fmt: skip
    built = ensure_reward_model(tmp_path, tiny_model_dir, verbose=False, **small)
    summary = read_reward_model_summary(built)
    assert summary["heldout"]["pairs"] == 3 * 2 and summary["settings"]["steps"] == 2
    assert ensure_reward_model(tmp_path, tiny_model_dir, verbose=False, **small) == built
    assert (
        ensure_reward_model(tmp_path, tiny_model_dir, verbose=False, **{**small, "steps": 3})
        != built
    )
    (score,) = RewardModelScorer(built).score([PROMPT], ["<answer>5</answer>"])
    assert 0.0 < score < 1.0


def test_same_problem_pairs():
    from zbrl.embedded.reward_model import same_problem_pairs

    labels = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]  # problems of 3: [1,0,0], [1,1,1], [0]
    assert same_problem_pairs(labels, 3) == [(0, 1), (0, 2)]


def test_column_trace_is_the_reference_and_its_mistakes_propagate():
    from zbrl.embedded.addition_task import make_row, reference_completion
    from zbrl.embedded.reward_model_data import column_trace, completion

    for a, b in [(37, 48), (7, 95), (0, 0), (99, 99), (50, 5)]:
        assert completion(*column_trace(a, b)) == reference_completion(make_row(a, b))
    assert column_trace(37, 48, delta=(1, 2)) == ("7+8=15,3+4+1=10", "105")  # carry out follows
    assert column_trace(37, 48, drop_carry=1) == ("7+8=15,3+4=7", "75")
    assert column_trace(37, 48, misread=(0, 1, 2)) == ("7+2=9,3+4=7", "79")


def test_corruptions_are_distinct_and_never_the_reference():
    import random

    from zbrl.embedded.addition_task import make_arithmetic_rows, reference_completion
    from zbrl.embedded.reward_model_data import corruptions, is_right

    rng = random.Random(0)
    for row in make_arithmetic_rows(50, seed=3, split="train"):
        out = corruptions(row, rng, 6)
        assert 1 <= len(out) <= 6 and len(set(out)) == len(out)
        assert reference_completion(row) not in out
        assert all(c.startswith("<think>") or len(c) < 7 for c in out)  # a cut tag at worst
        assert is_right(reference_completion(row), row["gt_answer"])
    assert not is_right("<think>7+8=15</answer>", "85")  # the format broken
    assert not is_right("<think>7+8=15,3+4+1=8</think><answer>85", "85")  # cut
    assert not is_right("<think>7+8=15,3+4+1=8</think><answer>84</answer>", "85")


def test_prefix_labels_follow_the_reference_until_the_first_mistake():
    from zbrl.embedded.reward_model_data import first_deviation, prefix_labels

    assert first_deviation("<answer>85</answer>", "<answer>85</answer>") is None
    assert first_deviation("<answer>86</answer>", "<answer>85</answer>") == 9
    assert first_deviation("<answer>8", "<answer>85</answer>") == 9  # cut short
    # one character per token; the prompt is "P:" (2 chars), the response starts at 2
    offsets = [(i, i + 1) for i in range(7)]
    labels, weights = prefix_labels(offsets, 2, 2, 0.0)  # response "abXde", mistake at "X"
    assert weights == [0, 0, 1, 1, 1, 1, 1]
    assert labels == [0, 0, 1, 1, 0, 0, 0]
    assert prefix_labels(offsets, 2, None, 1.0)[0] == [0, 0, 1, 1, 1, 1, 1]


def test_tokenwise_reward_model_builds_with_fresh_layers_and_corruption_figures(
    tmp_path, tiny_model_dir
):
    from transformers import AutoConfig

    from zbrl.embedded.reward_model import ensure_reward_model, read_reward_model_summary

    small = {"n_prompts": 4, "samples_per_prompt": 2, "steps": 2, "batch_size": 4,
             "eval_prompts": 3, "max_new_tokens": 8, "backbone_sft_steps": None,
             "objective": "tokenwise", "references": 5, "corruptions": 2,
             "extra_layers": 1}  # fmt: skip
    built = ensure_reward_model(tmp_path, tiny_model_dir, verbose=False, **small)
    heldout = read_reward_model_summary(built)["heldout"]
    assert heldout["corruption_pairs"] == 3 * 6
    assert 0.0 <= heldout["reference_over_corruption"] <= 1.0
    policy_layers = AutoConfig.from_pretrained(tiny_model_dir).num_hidden_layers
    assert AutoConfig.from_pretrained(built).num_hidden_layers == policy_layers + 1
    (score,) = RewardModelScorer(built).score([PROMPT], ["<answer>5</answer>"])
    assert 0.0 < score < 1.0
