"""Pure per-group filters used by the rollout buffer (plain Python; a tensor is taken
where torch is already imported; no state). They import no torch: the rollout buffer, and the
driver that creates it, start without it (docs/performance.md, Start-up).

- :func:`group_in_accuracy_range` — DAPO-style dynamic sampling: drop groups that are all right
  or all wrong (their advantages would be zero anyway).
- :func:`is_zero_variance` — drop groups whose rewards carry no learning signal.
- :func:`truncation_keep_mask` — per-sample loss mask that excludes truncated responses. It is a
  *loss* mask: truncated samples still take part in their group's mean/std (as in the seed system),
  they are only not trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from zbrl.types import is_tensor

if TYPE_CHECKING:  # the rollout buffer's process and the driver run these without torch
    import torch


def group_in_accuracy_range(
    ans_acc_G: Sequence[float], filter_range: tuple[float, float] | None
) -> bool:
    """Keep a group when ``lo < mean(ans_acc_G) < hi`` (strict); ``None`` keeps every group."""
    if filter_range is None:
        return True
    lo, hi = filter_range
    if lo > hi:
        raise ValueError(f"filter_range must be (low, high) with low <= high; got {filter_range}")
    values = [float(v) for v in ans_acc_G]
    if not values:
        raise ValueError("group_in_accuracy_range: the group has no samples (ans_acc_G is empty)")
    mean_acc = sum(values) / len(values)
    return lo < mean_acc < hi


def is_zero_variance(rewards_G: Sequence[float] | torch.Tensor, tol: float = 1e-8) -> bool:
    """True when all rewards of the group lie within ``tol`` of each other (max - min <= tol)."""
    if is_tensor(rewards_G):
        values = rewards_G.detach().reshape(-1).double().tolist()
    else:
        values = [float(v) for v in rewards_G]
    if not values:
        raise ValueError("is_zero_variance: the group has no rewards (rewards_G is empty)")
    return max(values) - min(values) <= tol


def truncation_keep_mask(truncated_G: Sequence[bool]) -> list[bool]:
    """``[not truncated]`` per sample: True = keep the sample in the loss."""
    return [not bool(t) for t in truncated_G]
