"""The run's reward function from ``RunConfig.reward``: the primary reward with its options,
plus weighted extra rewards."""

from __future__ import annotations

from typing import Any

from zbrl.config import RunConfig
from zbrl.rewards import CombinedReward, LengthShaping, build_reward
from zbrl.rewards.base import RewardFunction


def build_reward_fn(cfg: RunConfig) -> RewardFunction:
    """The primary reward with its options, plus weighted extra rewards."""
    rw = cfg.reward
    primary = build_reward(rw.type, **_primary_options(cfg))
    if not rw.extra:
        return primary
    parts: list[tuple[RewardFunction, float]] = [(primary, 1.0)]
    parts += [(build_reward(e.type, **e.options), e.weight) for e in rw.extra]
    return CombinedReward(parts)


def _primary_options(cfg: RunConfig) -> dict[str, Any]:
    rw = cfg.reward
    if rw.type == "code":
        from zbrl.rewards.sandbox import SandboxLimits

        return {
            "limits": SandboxLimits(timeout_s=rw.sandbox.timeout_s, memory_mb=rw.sandbox.memory_mb),
            "max_workers": rw.sandbox.max_workers,
            "correct_reward": rw.correct_reward,
        }
    if ":" in rw.type:
        return {}
    options: dict[str, Any] = {
        "correct_reward": rw.correct_reward,
        "wrong_reward": rw.wrong_reward,
        "length_shaping": length_shaping(cfg),
    }
    if rw.format_tags is not None:
        options["tags"] = tuple(rw.format_tags)
    return options


def length_shaping(cfg: RunConfig) -> LengthShaping | None:
    rw = cfg.reward
    if not rw.soft_overlong_punishment:
        return None
    return LengthShaping(
        max_new_tokens=cfg.rollout.generation.max_new_tokens,
        cache_length=cfg.cache_length,
        max_penalty=rw.overlong_penalty,
        truncated_value=rw.truncated_penalty,
    )
