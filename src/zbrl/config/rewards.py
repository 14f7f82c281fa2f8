"""How responses are scored."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from zbrl.config.base import Section


class SandboxConfig(Section):
    """Limits of the local code sandbox used by the ``code`` reward."""

    timeout_s: float = Field(default=5.0, gt=0)
    """Wall-clock limit of one test case."""
    memory_mb: int = Field(default=512, ge=16)
    """Address-space limit of a candidate program."""
    max_workers: int = Field(default=2, ge=1)
    """Candidate programs run in parallel."""


class ExtraReward(Section):
    """An additional reward combined with the primary one."""

    type: str
    """Registered reward name or ``package.module:function``."""
    weight: float = 1.0
    """Weight of this reward in the sum."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options passed to the reward's constructor."""


class RewardConfig(Section):
    """The verifiable reward."""

    type: str = "think_answer_tags"
    """Primary reward: ``think_answer_tags``, ``boxed``, ``code`` or ``package.module:function``."""
    format_tags: list[str] | None = None
    """Tags the format check requires; None uses the reward type's own."""
    correct_reward: float = 1.0
    """Reward of a correct answer with valid format."""
    wrong_reward: float = 0.0
    """Reward of a wrong or unformatted answer."""
    soft_overlong_punishment: bool = False
    """DAPO soft overlong punishment over the last ``cache_length`` tokens of the budget."""
    cache_length: int | None = Field(default=None, ge=1)
    """Length of the punishment zone; None means min(1024, max_new_tokens // 4)."""
    overlong_penalty: float = Field(default=1.0, ge=0)
    """Largest soft overlong penalty (reached at the generation limit)."""
    truncated_penalty: float | None = None
    """Penalty added to a truncated response when shaping is on; None means ``-overlong_penalty``.
    Must be <= -overlong_penalty so truncation never beats a response just under the limit."""
    extra: list[ExtraReward] = Field(default_factory=list)
    """Further rewards added with weights (format bonus, length, user functions)."""
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    """Code sandbox limits (``code`` reward only)."""
