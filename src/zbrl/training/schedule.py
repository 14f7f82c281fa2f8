"""Learning-rate schedule: linear warmup, then cosine decay to a floor (or constant)."""

from __future__ import annotations

import math


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, decay: str, min_ratio: float
) -> float:
    """Multiplier of the peak LR at optimizer step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
