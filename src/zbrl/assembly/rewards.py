"""The run's reward function from ``RunConfig.reward``: the primary reward built from its typed
variant (every option of the variant reaches the reward), plus weighted extra rewards.

Also what the dataset needs from the reward: the answer field it scores against and its default
system prompt, both owned by the reward class.
"""

from __future__ import annotations

from typing import Any

from zbrl.config import (
    CodeReward,
    ConfigError,
    LengthShapingOptions,
    MathRewardOptions,
    ReasoningGymReward,
    ReasoningGymSource,
    RunConfig,
    UserReward,
)
from zbrl.rewards import CombinedReward, LengthShaping, build_reward, build_user_reward
from zbrl.rewards.answers import ANSWER_SPECS, AnswerSpec
from zbrl.rewards.base import RewardFunction
from zbrl.rewards.registry import lookup_reward


def build_reward_fn(cfg: RunConfig) -> RewardFunction:
    """The primary reward with its options, plus weighted extra rewards.

    Raises a clear error for an import path that does not import, options a reward does not take,
    or an unknown extra reward, so ``zbrl validate`` and the start of ``zbrl train`` catch them.
    """
    rw = cfg.reward
    primary = _primary(cfg)
    if not rw.extra:
        return primary
    parts: list[tuple[RewardFunction, float]] = [(primary, 1.0)]
    parts += [(build_reward(e.type, **e.options), e.weight) for e in rw.extra]
    return CombinedReward(parts)


def check_reward(cfg: RunConfig) -> None:
    """Build the reward once, so that a reward that cannot be built (an unknown extra reward, an
    import path that does not import, options it does not take) fails before any work starts,
    as a :class:`~zbrl.config.ConfigError` naming ``reward``."""
    try:
        build_reward_fn(cfg)
    except (ImportError, KeyError, TypeError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ConfigError(f"reward: {message}") from exc


def _primary(cfg: RunConfig) -> RewardFunction:
    rw = cfg.reward
    if isinstance(rw, UserReward):
        return build_user_reward(rw.type, rw.options, timeout_s=rw.timeout_s)
    shaping = length_shaping(cfg)
    if isinstance(rw, CodeReward):
        from zbrl.rewards.sandbox import SandboxLimits

        return build_reward(
            rw.type,
            correct_reward=rw.correct_reward,
            partial_credit=rw.partial_credit,
            limits=SandboxLimits(
                timeout_s=rw.sandbox.timeout_s,
                memory_mb=rw.sandbox.memory_mb,
                backend=rw.sandbox.backend,
            ),
            max_workers=rw.sandbox.max_workers,
            length_shaping=shaping,
        )
    options: dict[str, Any] = {
        "correct_reward": rw.correct_reward,
        "wrong_reward": rw.wrong_reward,
        "length_shaping": shaping,
        "timeout_s": rw.timeout_s,
    }
    if isinstance(rw, MathRewardOptions) and rw.format_tags is not None:
        options["tags"] = tuple(rw.format_tags)
    if isinstance(rw, ReasoningGymReward):
        options["extract"] = rw.extract
        source = cfg.data.source
        if isinstance(source, ReasoningGymSource):  # score with the tasks' own configs
            options["tasks"] = [t.model_dump() for t in source.tasks]
    return build_reward(rw.type, **options)


def length_shaping(cfg: RunConfig) -> LengthShaping | None:
    rw = cfg.reward
    if not isinstance(rw, LengthShapingOptions) or not rw.soft_overlong_punishment:
        return None
    return LengthShaping(
        max_new_tokens=cfg.rollout.generation.max_new_tokens,
        cache_length=cfg.cache_length,
        max_penalty=rw.overlong_penalty,
        truncated_value=rw.truncated_penalty,
    )


def _reward_class(cfg: RunConfig) -> Any:
    """The built-in reward class of the configured variant (None for a user reward)."""
    return None if isinstance(cfg.reward, UserReward) else lookup_reward(cfg.reward.type)


def answer_spec(cfg: RunConfig) -> AnswerSpec:
    """The dataset field the configured reward scores against."""
    cls = _reward_class(cfg)
    if cls is not None:
        return cls.answer
    return ANSWER_SPECS[cfg.reward.answer_field]


def default_system_prompt(cfg: RunConfig) -> str | None:
    """The configured reward's own system prompt (None for a user reward); for the
    ``reasoning_gym`` reward, the prompt of its ``extract`` format."""
    if isinstance(cfg.reward, ReasoningGymReward):
        from zbrl.rewards.extraction import EXTRACTION_PROMPTS

        return EXTRACTION_PROMPTS[cfg.reward.extract]
    cls = _reward_class(cfg)
    return cls.system_prompt if cls is not None else None
