"""Typed plug-ins (issue 13): every option of a variant reaches its component, and every option
that belongs to another variant is refused by name — never accepted and ignored."""

from __future__ import annotations

import logging
import math
import typing

import pytest
import torch

from zbrl.algorithms import compute_advantages
from zbrl.assembly.rewards import answer_spec, build_reward_fn, default_system_prompt
from zbrl.assembly.settings import advantage_options, loss_config, step_settings
from zbrl.cli import main
from zbrl.config import (
    AlgorithmConfig,
    ConfigError,
    RunConfig,
    load_config,
)
from zbrl.config.plugin import variant_tag
from zbrl.rewards import FunctionReward, RewardContext, UserRewardError

DEMO = "recipes/demo.yaml"
USER = "zbrl.testing.faults:options_reward"


def _variants(model: type, field: str) -> list[type]:
    union = model.model_fields[field].annotation  # Union[Annotated[Variant, Tag], ...]
    return [typing.get_args(member)[0] for member in typing.get_args(union)]


def _type_of(variant: type) -> str:
    return variant_tag(variant) if variant_tag(variant) != "import" else USER


def _foreign_options(variants: list[type], variant: type) -> list[str]:
    """Option fields some other variant has and ``variant`` has not."""
    own = set(variant.model_fields)
    return sorted({f for v in variants for f in v.model_fields} - own)


PLUGINS = [
    ("algorithm.advantage", _variants(AlgorithmConfig, "advantage")),
    ("algorithm.policy_loss", _variants(AlgorithmConfig, "policy_loss")),
    ("reward", _variants(RunConfig, "reward")),
]
PAIRS = [
    (prefix, variant, option)
    for prefix, variants in PLUGINS
    for variant in variants
    for option in _foreign_options(variants, variant)
]


@pytest.mark.parametrize(
    ("prefix", "variant", "option"),
    PAIRS,
    ids=[f"{p}.{_type_of(v)}.{o}" for p, v, o in PAIRS],
)
def test_an_option_of_another_variant_is_refused_by_name(prefix, variant, option):
    value = "{}" if option in ("options", "sandbox") else "1"
    overrides = [f"{prefix}.type={_type_of(variant)}", f"{prefix}.{option}={value}"]
    with pytest.raises(ConfigError, match=rf"field '{prefix}.{option}': unknown field"):
        load_config(DEMO, overrides)


def test_the_issue_example_applies_shaping_to_the_code_reward():
    """`reward.type=code reward.soft_overlong_punishment=true` is applied, not ignored."""
    cfg = load_config(DEMO, ["reward.type=code", "reward.soft_overlong_punishment=true"])
    reward = build_reward_fn(cfg)
    assert reward.name == "code"
    assert reward.length_shaping is not None
    budget = cfg.rollout.generation.max_new_tokens
    assert reward.length_shaping.max_new_tokens == budget
    assert reward.length_shaping.penalty(budget, truncated=True) < 0
    for refused in ("reward.wrong_reward=0.5", "reward.format_tags=[a]"):
        expect = r"unknown field; known fields here \(for type code\)"
        with pytest.raises(ConfigError, match=expect):
            load_config(DEMO, ["reward.type=code", refused])


def test_every_math_reward_option_reaches_the_reward():
    for kind in ("think_answer_tags", "boxed"):
        cfg = load_config(
            DEMO,
            [
                f"reward.type={kind}",
                "reward.correct_reward=2.5",
                "reward.wrong_reward=-0.5",
                "reward.timeout_s=7",
                "reward.format_tags=[<a>, </a>, <b>, </b>]",
                "reward.soft_overlong_punishment=true",
                "reward.overlong_penalty=0.5",
                "reward.cache_length=4",
            ],
        )
        reward = build_reward_fn(cfg)
        assert (reward.correct_reward, reward.wrong_reward, reward.timeout_s) == (2.5, -0.5, 7)
        assert tuple(reward.tags) == ("<a>", "</a>", "<b>", "</b>")
        assert reward.length_shaping.cache_length == 4
        assert reward.length_shaping.max_penalty == 0.5


def test_every_code_reward_option_reaches_the_reward():
    cfg = load_config(
        DEMO,
        [
            "reward.type=code",
            "reward.correct_reward=3",
            "reward.partial_credit=true",
            "reward.sandbox.timeout_s=2",
            "reward.sandbox.memory_mb=256",
            "reward.sandbox.max_workers=1",
        ],
    )
    reward = build_reward_fn(cfg)
    assert (reward.correct_reward, reward.partial_credit, reward.max_workers) == (3.0, True, 1)
    assert (reward.limits.timeout_s, reward.limits.memory_mb) == (2.0, 256)
    assert answer_spec(cfg).field == "test_cases" and "```python" in default_system_prompt(cfg)


def test_a_user_reward_gets_its_options_answer_field_and_deadline():
    cfg = load_config(
        DEMO,
        [
            f"reward.type={USER}",
            "reward.options={bonus: 0.75}",
            "reward.answer_field=test_cases",
            "reward.timeout_s=9",
        ],
    )
    reward = build_reward_fn(cfg)
    assert isinstance(reward, FunctionReward)
    assert reward.options == {"bonus": 0.75} and reward.timeout_s == 9
    assert answer_spec(cfg).field == "test_cases" and default_system_prompt(cfg) is None
    no_deadline = load_config(DEMO, [f"reward.type={USER}", "reward.timeout_s=null"])
    ctx = RewardContext(response_tokens=3, max_new_tokens=8)
    result = build_reward_fn(no_deadline).score("x", {"gt_answer": "1"}, ctx)
    assert result.reward == 0.0  # the default bonus


def test_every_advantage_option_reaches_the_estimator():
    rewards_BG = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    plain = load_config(DEMO, ["algorithm.advantage.type=reinforce_pp"])
    tuned = load_config(
        DEMO,
        [
            "algorithm.advantage.type=reinforce_pp",
            "algorithm.advantage.group_baseline=false",
            "algorithm.advantage.std_unbiased=false",
            "algorithm.advantage.eps=0.5",
        ],
    )
    assert advantage_options(tuned) == {"group_baseline": False, "eps": 0.5, "std_unbiased": False}
    settings = step_settings(tuned, pad_id=0)
    assert settings.advantage == "reinforce_pp"
    got = compute_advantages(settings.advantage, rewards_BG, **settings.advantage_kwargs)
    x = rewards_BG  # no group baseline: whiten the raw rewards, population std, eps 0.5
    torch.testing.assert_close(got, (x - x.mean()) / (x.std(correction=0) + 0.5))
    default = compute_advantages("reinforce_pp", rewards_BG, **advantage_options(plain))
    assert not torch.allclose(default, got)
    user = load_config(
        DEMO, ["algorithm.advantage.type=my.pkg:estimator", "algorithm.advantage.options={k: 2}"]
    )
    assert step_settings(user, 0).advantage == "my.pkg:estimator"
    assert advantage_options(user) == {"k": 2}


def test_every_policy_loss_option_reaches_the_loss():
    cfg = load_config(
        DEMO,
        [
            "algorithm.policy_loss.clip_eps_low=0.1",
            "algorithm.policy_loss.clip_eps_high=0.3",
            "algorithm.policy_loss.dual_clip_c=4",
        ],
    )
    loss = loss_config(cfg)
    assert (loss.clip_eps_low, loss.clip_eps_high, loss.dual_clip_c) == (0.1, 0.3, 4.0)
    user = load_config(
        DEMO, ["algorithm.policy_loss.type=my.pkg:loss", "algorithm.policy_loss.options={w: 3}"]
    )
    assert step_settings(user, 0).policy_loss == "my.pkg:loss"
    assert dict(loss_config(user).options) == {"w": 3}


def test_plugin_shorthand_and_unknown_types():
    assert load_config(DEMO, ["algorithm.advantage=rloo"]).algorithm.advantage.type == "rloo"
    with pytest.raises(ConfigError, match=r"'algorithm.advantage': unknown type 'nope'"):
        load_config(DEMO, ["algorithm.advantage=nope"])
    with pytest.raises(ConfigError, match=r"'reward': unknown type 'maths'"):
        load_config(DEMO, ["reward.type=maths"])


def test_a_preset_fills_only_what_the_chosen_variant_has():
    dapo_user = load_config(DEMO, ["algorithm.preset=dapo", f"reward.type={USER}"])
    assert dapo_user.reward.type == USER  # DAPO's shaping does not apply to a user reward
    dapo_code = load_config(DEMO, ["algorithm.preset=dapo", "reward.type=code"])
    assert dapo_code.reward.soft_overlong_punishment is True
    rloo_loss = load_config(
        DEMO, ["algorithm.preset=dapo", "algorithm.policy_loss.type=my.pkg:loss"]
    )
    assert rloo_loss.algorithm.policy_loss.type == "my.pkg:loss"  # clip options not forced on


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        ("reward.extra=[{type: nope}]", "unknown reward 'nope'"),
        ("reward.type=no_such_module_zz:fn", "cannot import module 'no_such_module_zz'"),
        ("reward.options={nonsense: 1}", "cannot take options ['nonsense']"),
    ],
)
def test_validate_builds_the_reward(override, expect, capsys):
    overrides = [override] if "options" not in override else [f"reward.type={USER}", override]
    assert main(["validate", DEMO, *overrides]) == 2
    assert expect in capsys.readouterr().err


def test_a_hanging_user_reward_times_out_without_a_score(caplog):
    reward = FunctionReward(
        __import__("zbrl.testing.faults", fromlist=["x"]).sleeping_reward,
        "zbrl.testing.faults:sleeping_reward",
        timeout_s=0.5,
    )
    ctx = RewardContext(response_tokens=3, max_new_tokens=8)
    with caplog.at_level(logging.WARNING, logger="zbrl.rewards.registry"):
        results = reward.score_batch(["a", "b"], [{}, {}], [ctx, ctx])
    assert all(math.isnan(r.reward) and r.failed for r in results)  # never a number
    assert all(r.timed_out and r.ans_acc == 0.0 for r in results)
    assert reward.timeouts == 2
    assert "did not return within 0.5 s" in caplog.text


def test_a_user_reward_error_keeps_the_users_traceback():
    from zbrl.testing import faults

    reward = FunctionReward(faults.failing_reward, "zbrl.testing.faults:failing_reward")
    ctx = RewardContext(response_tokens=3, max_new_tokens=8)
    with pytest.raises(UserRewardError) as info:
        reward.score("a", {}, ctx)
    text = str(info.value)
    assert "raised InjectedFault: injected producer failure" in text
    assert 'faults.py", line' in text and "in failing_reward" in text
    with_deadline = FunctionReward(
        faults.failing_reward, "zbrl.testing.faults:failing_reward", timeout_s=30
    )
    with pytest.raises(UserRewardError, match=r'(?s)faults.py", line \d+, in failing_reward'):
        with_deadline.score("a", {}, ctx)


def test_train_refuses_a_reward_that_cannot_be_built_before_creating_anything(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", DEMO, "reward.extra=[{type: nope}]", f"logging.run_dir={run_dir}"])
    assert code == 2
    assert "unknown reward 'nope'" in capsys.readouterr().err
    assert not run_dir.exists()
