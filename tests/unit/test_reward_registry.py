"""Reward registry: names, lazy built-ins, user rewards by import path, combined rewards."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zbrl.rewards import (
    REWARDS,
    BaseReward,
    BoxedReward,
    CombinedReward,
    FunctionReward,
    RewardContext,
    RewardFunction,
    RewardResult,
    ThinkAnswerReward,
    build_reward,
    register_reward,
)

CTX = RewardContext(response_tokens=10, max_new_tokens=100)
EXAMPLE = {"gt_answer": "5"}
GOOD = "<think>2+3</think><answer>5</answer>"


# User rewards referenced by import path f"{__name__}:..." (works however pytest names this module)


def float_reward(response, example, ctx):
    return 0.25 if "5" in response else -0.5


def tuple_reward(response, example, ctx):
    return (2.0, 1.0, 0.5)


def list_reward(response, example, ctx):
    return [1, 0, 1]


def bool_reward(response, example, ctx):
    return response.endswith("</answer>")


def result_reward(response, example, ctx):
    return RewardResult(reward=3.0, format_acc=0.0, ans_acc=1.0, parsed="x", metadata={"k": 1})


def scaled_reward(response, example, ctx, *, scale=1.0):
    return scale * len(response)


def str_reward(response, example, ctx):
    return "1.0"


def short_tuple_reward(response, example, ctx):
    return (1.0, 1.0)


def nan_reward(response, example, ctx):
    return float("nan")


def bad_acc_reward(response, example, ctx):
    return (1.0, 2.0, 0.0)


class LengthReward(BaseReward):
    name = "length"

    def __init__(self, *, per_char: float = 1.0):
        self.per_char = per_char

    def score(self, response, example, ctx):
        return RewardResult(reward=self.per_char * len(response), format_acc=1.0, ans_acc=0.0)


READY_MADE = LengthReward(per_char=2.0)
NOT_A_REWARD = 42


class CountingReward(BaseReward):
    """Records how it was called, to check that CombinedReward batches."""

    name = "counting"

    def __init__(self, value: float):
        self.value = value
        self.batch_calls = 0

    def score(self, response, example, ctx):
        return RewardResult(reward=self.value, format_acc=0.0, ans_acc=0.0)

    def score_batch(self, responses, examples, contexts):
        self.batch_calls += 1
        return super().score_batch(responses, examples, contexts)


def path(attr: str) -> str:
    return f"{__name__}:{attr}"


# ------------------------------------------------------------------ names


def test_builtin_names():
    reward = build_reward("think_answer_tags", correct_reward=2.0)
    assert isinstance(reward, ThinkAnswerReward) and isinstance(reward, RewardFunction)
    assert reward.name == "think_answer_tags"
    assert reward.score(GOOD, EXAMPLE, CTX).reward == 2.0
    boxed = build_reward("boxed", tags=["<think>"])
    assert isinstance(boxed, BoxedReward) and boxed.tags == ("<think>",)
    assert {"think_answer_tags", "boxed"} <= set(REWARDS.names())


def test_unknown_name_lists_known_names():
    with pytest.raises(KeyError) as info:
        build_reward("think_answer_tag")
    message = str(info.value)
    assert "unknown reward 'think_answer_tag'" in message
    known = "boxed, code, http, last_number, reasoning_gym, reward_model, think_answer_tags"
    assert known in message
    assert "package.module:function" in message


@pytest.mark.parametrize("bad", ["", "   ", None, 3])
def test_empty_or_non_string_name(bad):
    with pytest.raises(ValueError, match=r"registered name or 'package\.module:function'"):
        build_reward(bad)


def test_bad_option_names_the_reward_and_accepted_options():
    with pytest.raises(
        TypeError, match=r"reward 'boxed' cannot take options \['corect_reward'\]"
    ) as info:
        build_reward("boxed", corect_reward=1.0)
    assert "correct_reward" in str(info.value).split("it accepts:")[1]


def test_code_reward_is_lazy():
    # a fresh interpreter: importing zbrl.rewards imports neither the code reward nor ray/torch
    probe = (
        "import sys, zbrl.rewards\n"
        "heavy = ('zbrl.rewards.code', 'ray', 'torch', 'math_verify')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_code_reward_builds_by_name():
    pytest.importorskip("zbrl.rewards.code")
    reward = build_reward("code")
    assert reward.name == "code" and isinstance(reward, RewardFunction)
    assert "code" in REWARDS


def test_register_reward_sets_name_and_rejects_duplicates():
    @register_reward("test_registry_constant")
    class Constant(BaseReward):
        def __init__(self, value: float = 1.0):
            self.value = value

        def score(self, response, example, ctx):
            return RewardResult(reward=self.value, format_acc=1.0, ans_acc=1.0)

    assert Constant.name == "test_registry_constant"
    assert build_reward("test_registry_constant", value=0.5).score("", {}, CTX).reward == 0.5
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_registry_constant")(LengthReward)


def test_registered_factory_must_build_a_reward():
    REWARDS.register("test_registry_not_a_reward")(lambda: object())
    with pytest.raises(TypeError, match="not a reward"):
        build_reward("test_registry_not_a_reward")


# ------------------------------------------------------------------ module:function


@pytest.mark.parametrize(
    ("attr", "response", "expected"),
    [
        ("float_reward", "5", (0.25, 1.0, 0.25)),
        ("float_reward", "4", (-0.5, 1.0, 0.0)),
        ("tuple_reward", "", (2.0, 1.0, 0.5)),
        ("list_reward", "", (1.0, 0.0, 1.0)),
        ("bool_reward", GOOD, (1.0, 1.0, 1.0)),
        ("result_reward", "", (3.0, 0.0, 1.0)),
    ],
)
def test_user_function_return_types(attr, response, expected):
    reward = build_reward(path(attr))
    assert isinstance(reward, FunctionReward) and reward.name == path(attr)
    result = reward.score(response, EXAMPLE, CTX)
    assert (result.reward, result.format_acc, result.ans_acc) == pytest.approx(expected)
    batch = reward.score_batch([response, response], [EXAMPLE, EXAMPLE], [CTX, CTX])
    assert [r.reward for r in batch] == pytest.approx([expected[0]] * 2)


def test_user_function_result_is_kept():
    result = build_reward(path("result_reward")).score("", EXAMPLE, CTX)
    assert result.parsed == "x" and result.metadata == {"k": 1}


def test_user_function_options_are_passed_on_every_call():
    reward = build_reward(path("scaled_reward"), scale=0.5)
    assert reward.score("abcd", EXAMPLE, CTX).reward == 2.0
    with pytest.raises(TypeError, match=r"cannot take options.*it accepts: scale"):
        build_reward(path("scaled_reward"), scael=0.5)


@pytest.mark.parametrize(
    ("attr", "error", "message"),
    [
        ("str_reward", TypeError, r"returned str '1.0'; it must return a RewardResult, a number"),
        ("short_tuple_reward", TypeError, r"returned tuple \(1.0, 1.0\)"),
        ("nan_reward", ValueError, "non-finite reward"),
        ("bad_acc_reward", ValueError, r"format_acc=2.0, not in \[0, 1\]"),
    ],
)
def test_user_function_bad_return_names_the_path(attr, error, message):
    reward = build_reward(path(attr))
    with pytest.raises(error, match=message) as info:
        reward.score("", EXAMPLE, CTX)
    assert path(attr) in str(info.value)


def test_path_to_class_object_and_errors():
    reward = build_reward(path("LengthReward"), per_char=3.0)
    assert reward.score("ab", EXAMPLE, CTX).reward == 6.0
    assert build_reward(path("READY_MADE")) is READY_MADE
    with pytest.raises(TypeError, match="takes no options"):
        build_reward(path("READY_MADE"), per_char=1.0)
    with pytest.raises(TypeError, match="is a int, not a function"):
        build_reward(path("NOT_A_REWARD"))
    with pytest.raises(ImportError, match="has no attribute 'missing_fn'"):
        build_reward(path("missing_fn"))
    with pytest.raises(ImportError, match="cannot import module 'no_such_module_zbrl'"):
        build_reward("no_such_module_zbrl:fn")


# ------------------------------------------------------------------ combined


def test_combined_weights_and_primary_accuracies():
    primary = build_reward("think_answer_tags")
    bonus = build_reward(path("tuple_reward"))  # reward 2.0, format_acc 1.0, ans_acc 0.5
    combined = CombinedReward([(primary, 1.0), (bonus, 0.25)])
    good = combined.score(GOOD, EXAMPLE, CTX)
    assert good.reward == pytest.approx(1.0 + 0.25 * 2.0)
    assert (good.format_acc, good.ans_acc, good.parsed) == (1.0, 1.0, "5")
    assert good.metadata["component_rewards"] == {
        "think_answer_tags": 1.0,
        path("tuple_reward"): 2.0,
    }
    assert good.metadata["primary"]["reason"] == "correct"
    bad = combined.score("no tags", EXAMPLE, CTX)
    assert bad.reward == pytest.approx(0.5)
    assert (bad.format_acc, bad.ans_acc) == (0.0, 0.0)  # from the primary, not the bonus


def test_combined_negative_weight_repeated_names_and_batching():
    a, b = CountingReward(1.0), CountingReward(4.0)
    combined = CombinedReward([(a, 2.0), (b, -0.5)])
    results = combined.score_batch(["x", "y", "z"], [EXAMPLE] * 3, [CTX] * 3)
    assert [r.reward for r in results] == pytest.approx([0.0, 0.0, 0.0])
    assert results[0].metadata["component_rewards"] == {"counting": 1.0, "counting#2": 4.0}
    assert (a.batch_calls, b.batch_calls) == (1, 1)
    assert combined.name == "2*counting+-0.5*counting"


def test_combined_validation():
    with pytest.raises(ValueError, match="at least one"):
        CombinedReward([])
    with pytest.raises(TypeError, match="not a reward"):
        CombinedReward([(float_reward, 1.0)])
    with pytest.raises(TypeError, match="weight must be a number"):
        CombinedReward([(CountingReward(1.0), "1")])
    with pytest.raises(ValueError, match="weight must be finite"):
        CombinedReward([(CountingReward(1.0), float("inf"))])
    with pytest.raises(ValueError, match="one example and one context per response"):
        CombinedReward([(CountingReward(1.0), 1.0)]).score_batch(["a"], [], [CTX])


@pytest.mark.parametrize("name", ["think_answer_tags", "boxed", "code"])
def test_length_shaping_option_accepts_a_dict_and_rejects_other_types(name):
    shaped = build_reward(name, length_shaping={"max_new_tokens": 100, "cache_length": 20})
    assert shaped.length_shaping.cache_length == 20
    with pytest.raises(TypeError, match=f"{name}: length_shaping must be a LengthShaping"):
        build_reward(name, length_shaping=3)
