"""Pure-torch RL math: advantages, policy losses, KL, loss aggregation, log-probs, filters.

Nothing here imports ``ray`` or ``torch.distributed``; see ``docs/algorithms.md``. Each name is
imported from its module on first use, so that a process needing the torch-free filters (the
rollout buffer, and the driver that creates it) does not import torch with the package
(docs/performance.md, Start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zbrl.lazy import lazy_attributes

if TYPE_CHECKING:
    from zbrl.algorithms.advantages import (
        ADVANTAGE_ESTIMATORS,
        MIN_GROUP_SIZE,
        compute_advantages,
    )
    from zbrl.algorithms.aggregation import (
        AGGREGATION_MODES,
        Normalisers,
        aggregate,
        normalisers_for,
    )
    from zbrl.algorithms.filters import (
        group_in_accuracy_range,
        is_zero_variance,
        truncation_keep_mask,
    )
    from zbrl.algorithms.kl import KL_KINDS, kl_estimate
    from zbrl.algorithms.logprobs import (
        entropy_from_logits,
        logprobs_and_entropy,
        logprobs_from_hidden,
        logprobs_from_logits,
    )
    from zbrl.algorithms.policy_loss import (
        POLICY_LOSSES,
        LossConfig,
        LossInputs,
        LossOutputs,
        compute_policy_loss,
    )

_HOMES = {
    "ADVANTAGE_ESTIMATORS": "advantages",
    "MIN_GROUP_SIZE": "advantages",
    "compute_advantages": "advantages",
    "AGGREGATION_MODES": "aggregation",
    "Normalisers": "aggregation",
    "aggregate": "aggregation",
    "normalisers_for": "aggregation",
    "group_in_accuracy_range": "filters",
    "is_zero_variance": "filters",
    "truncation_keep_mask": "filters",
    "KL_KINDS": "kl",
    "kl_estimate": "kl",
    "entropy_from_logits": "logprobs",
    "logprobs_and_entropy": "logprobs",
    "logprobs_from_hidden": "logprobs",
    "logprobs_from_logits": "logprobs",
    "POLICY_LOSSES": "policy_loss",
    "LossConfig": "policy_loss",
    "LossInputs": "policy_loss",
    "LossOutputs": "policy_loss",
    "compute_policy_loss": "policy_loss",
}
"""Where each name lives, imported on first use."""

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATION_MODES",
    "KL_KINDS",
    "MIN_GROUP_SIZE",
    "POLICY_LOSSES",
    "LossConfig",
    "LossInputs",
    "LossOutputs",
    "Normalisers",
    "aggregate",
    "compute_advantages",
    "compute_policy_loss",
    "entropy_from_logits",
    "group_in_accuracy_range",
    "is_zero_variance",
    "kl_estimate",
    "logprobs_and_entropy",
    "logprobs_from_hidden",
    "logprobs_from_logits",
    "normalisers_for",
    "truncation_keep_mask",
]

__getattr__ = lazy_attributes(__name__, _HOMES)
