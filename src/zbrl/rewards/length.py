"""Length shaping: DAPO's soft overlong punishment, made monotonic.

With ``R = max_new_tokens``, ``C = cache_length`` and ``P = max_penalty``, a response of ``L``
generated tokens gets the additive penalty

* ``0``                           for ``L <= R - C``
* ``-P * (L - (R - C)) / C``      for ``R - C < L < R``  (linear, from 0 towards ``-P``)
* ``truncated_value``             when the response was truncated, or ``L >= R``

(Yu et al. 2025, "DAPO", soft overlong punishment). ``truncated_value`` defaults to ``-P`` and must
not be larger, so that the penalty never increases with length: a truncated response never scores
better than one that stopped just under the limit. The seed system gave truncated responses 0,
which rewarded running out of budget; zbrl refuses that configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zbrl.rewards.base import RewardContext


@dataclass(frozen=True)
class LengthShaping:
    """DAPO soft overlong punishment; ``penalty`` is added to a response's reward."""

    max_new_tokens: int
    """The generation budget ``R``."""
    cache_length: int
    """Length ``C`` of the punishment zone at the end of the budget (DAPO: min(1024, R/4))."""
    max_penalty: float = 1.0
    """Penalty ``P`` approached at the end of the zone."""
    truncated_value: float | None = None
    """Penalty of a truncated response; None means ``-max_penalty``. Must be ``<= -max_penalty``."""

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise TypeError(
                f"LengthShaping.max_new_tokens must be an int, got {self.max_new_tokens!r}"
            )
        if isinstance(self.cache_length, bool) or not isinstance(self.cache_length, int):
            raise TypeError(f"LengthShaping.cache_length must be an int, got {self.cache_length!r}")
        if self.max_new_tokens < 1:
            raise ValueError(
                f"LengthShaping.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )
        if not 1 <= self.cache_length <= self.max_new_tokens:
            raise ValueError(
                f"LengthShaping.cache_length must be in [1, max_new_tokens={self.max_new_tokens}], "
                f"got {self.cache_length}; DAPO uses min(1024, max_new_tokens // 4)"
            )
        if not (math.isfinite(self.max_penalty) and self.max_penalty >= 0):
            raise ValueError(
                f"LengthShaping.max_penalty must be a finite number >= 0, got {self.max_penalty}"
            )
        if self.truncated_value is not None:
            if not math.isfinite(self.truncated_value):
                raise ValueError(
                    f"LengthShaping.truncated_value must be finite, got {self.truncated_value}"
                )
            if self.truncated_value > -self.max_penalty:
                raise ValueError(
                    f"LengthShaping.truncated_value={self.truncated_value} would score a truncated "
                    f"response better than one just under the limit (whose penalty approaches "
                    f"{-self.max_penalty}); set truncated_value <= {-self.max_penalty} "
                    f"(= -max_penalty), or leave it unset to use -max_penalty"
                )

    @classmethod
    def dapo(cls, max_new_tokens: int, max_penalty: float = 1.0) -> LengthShaping:
        """DAPO's default zone: ``cache_length = min(1024, max_new_tokens // 4)`` (at least 1)."""
        return cls(max_new_tokens, max(1, min(1024, max_new_tokens // 4)), max_penalty)

    @property
    def soft_start(self) -> int:
        """The longest response that gets no penalty (``R - C``)."""
        return self.max_new_tokens - self.cache_length

    @property
    def truncated_penalty(self) -> float:
        return 0.0 - self.max_penalty if self.truncated_value is None else self.truncated_value

    def penalty(self, response_tokens: int, truncated: bool = False) -> float:
        """The additive penalty (<= 0) of a response of ``response_tokens`` generated tokens."""
        if response_tokens < 0:
            raise ValueError(f"response_tokens must be >= 0, got {response_tokens}")
        if truncated or response_tokens >= self.max_new_tokens:
            return self.truncated_penalty
        excess = response_tokens - self.soft_start
        if excess <= 0:
            return 0.0
        return 0.0 - self.max_penalty * excess / self.cache_length


def as_length_shaping(
    value: LengthShaping | Mapping[str, Any] | None, owner: str
) -> LengthShaping | None:
    """A reward's ``length_shaping`` option: a LengthShaping, a dict of its fields, or None."""
    if isinstance(value, Mapping):
        return LengthShaping(**value)
    if value is not None and not isinstance(value, LengthShaping):
        raise TypeError(
            f"{owner}: length_shaping must be a LengthShaping, a dict of its fields or None, "
            f"got {type(value).__name__}"
        )
    return value


def training_penalty(shaping: LengthShaping | None, ctx: RewardContext) -> float:
    """The length penalty a reward adds to a response's score: ``shaping``'s in training, 0.0
    without shaping and in evaluation."""
    if shaping is None or ctx.eval_mode:
        return 0.0
    return shaping.penalty(ctx.response_tokens, ctx.truncated)
