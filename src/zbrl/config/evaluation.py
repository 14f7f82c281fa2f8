"""Held-out evaluation during training."""

from __future__ import annotations

from pydantic import Field

from zbrl.config.base import Section
from zbrl.config.model import EMBEDDED


class EvalConfig(Section):
    """Named eval sets, sampling and cadence."""

    sets: dict[str, str] = Field(default_factory=lambda: {"heldout": EMBEDDED})
    """Eval sets as ``{name: path}``; ``embedded`` is the synthetic task's held-out split,
    ``held_out`` the held-out split of the training data (of ``data.source`` when it is set)."""
    interval: int = Field(default=0, ge=0)
    """Evaluate every N training steps (0: not in between); the final policy is evaluated too
    when the run ends normally (not after a stop signal or a failure)."""
    at_start: bool = True
    """Evaluate the initial policy before training (a resumed run reuses the first run's
    initial figures)."""
    num_samples: int = Field(default=1, ge=1)
    """Samples per prompt (n); pass@k is reported for every power of two k <= n, and for n."""
    temperature: float = Field(default=0.6, ge=0)
    """Eval sampling temperature; 0 is greedy."""
    max_new_tokens: int | None = Field(default=None, ge=1)
    """Eval generation budget; None uses the rollout's ``max_new_tokens``."""
    max_prompts: int | None = Field(default=None, ge=1)
    """Evaluate only the first N prompts of each set; None uses all."""
    batch_size: int = Field(default=64, ge=1)
    """Prompts per eval generate call."""
