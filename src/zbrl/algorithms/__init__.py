"""Pure-torch RL math: advantages, policy losses, KL, loss aggregation, log-probs, filters.

Nothing here imports ``ray`` or ``torch.distributed``; see ``docs/algorithms.md``.
"""

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
