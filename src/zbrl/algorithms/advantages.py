"""Group-relative advantage estimators (GRPO family).

Every estimator maps the rewards of ``B`` prompts × ``G`` completions per prompt to one scalar
advantage per completion::

    fn(rewards_BG, *, eps=1e-6, std_unbiased=True, group_baseline=True, **kwargs) -> [B, G] float32

The advantage of a completion is later broadcast over all of its response tokens by the loss.

Invariants shared by all estimators (tested):

- a group whose rewards are all equal carries no learning signal and gets exactly ``0.0``
  advantage — never NaN, never a tiny ``eps``-scaled residue;
- ``G = 1`` gives zeros for ``grpo``/``dr_grpo``; ``rloo`` needs ``G >= 2`` and says so;
- the arithmetic is done in float64 (rewards are few) and the result returned as float32.

User estimators can be plugged in by import path (``"my_pkg.my_mod:my_estimator"``) through
:data:`ADVANTAGE_ESTIMATORS`; they should accept the same keyword arguments (or ``**kwargs``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zbrl.registry import Registry

AdvantageFn = Callable[..., torch.Tensor]

ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")

#: Smallest group size each built-in estimator is defined for.
MIN_GROUP_SIZE: dict[str, int] = {"grpo": 1, "dr_grpo": 1, "rloo": 2, "reinforce_pp": 1}


def _as_float64_BG(rewards_BG: torch.Tensor) -> torch.Tensor:
    rewards_BG = torch.as_tensor(rewards_BG)
    if rewards_BG.dim() != 2:
        raise ValueError(
            f"rewards_BG must have shape [B, G] (prompts × completions per prompt); "
            f"got shape {tuple(rewards_BG.shape)}"
        )
    rewards_BG = rewards_BG.detach().to(torch.float64)
    if not torch.isfinite(rewards_BG).all():
        raise ValueError("rewards_BG contains NaN or inf; check the reward functions' outputs")
    return rewards_BG


def _constant_groups_B1(rewards_BG: torch.Tensor) -> torch.Tensor:
    """``[B, 1]`` bool: True for groups whose rewards are all exactly equal."""
    return rewards_BG.amax(dim=1, keepdim=True) == rewards_BG.amin(dim=1, keepdim=True)


def _centered(rewards_BG: torch.Tensor) -> torch.Tensor:
    """``r - group mean``, exactly zero for constant groups (and for G = 1)."""
    centered_BG = rewards_BG - rewards_BG.mean(dim=1, keepdim=True)
    return centered_BG.masked_fill(_constant_groups_B1(rewards_BG), 0.0)


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(
    rewards_BG: torch.Tensor,
    *,
    eps: float = 1e-6,
    std_unbiased: bool = True,
    group_baseline: bool = True,
    **kwargs,
) -> torch.Tensor:
    """GRPO (Shao et al. 2024): ``(r - mean_g) / (std_g + eps)``.

    ``std_unbiased`` selects the N-1 (True) or N (False) standard deviation.
    ``group_baseline`` is accepted for a uniform signature and ignored.
    """
    rewards_BG = _as_float64_BG(rewards_BG)
    centered_BG = _centered(rewards_BG)
    if rewards_BG.shape[1] < 2:
        return centered_BG.to(torch.float32)  # all zeros; std is undefined for one sample
    std_B1 = rewards_BG.std(dim=1, keepdim=True, correction=1 if std_unbiased else 0)
    return (centered_BG / (std_B1 + eps)).to(torch.float32)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo(
    rewards_BG: torch.Tensor,
    *,
    eps: float = 1e-6,
    std_unbiased: bool = True,
    group_baseline: bool = True,
    **kwargs,
) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): ``r - mean_g``.

    No division by the group std (which up-weights easy and hard prompts). Pair it with the
    ``seq-mean-token-sum-norm`` aggregation to also remove the response-length bias.
    """
    return _centered(_as_float64_BG(rewards_BG)).to(torch.float32)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(
    rewards_BG: torch.Tensor,
    *,
    eps: float = 1e-6,
    std_unbiased: bool = True,
    group_baseline: bool = True,
    **kwargs,
) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): ``r_i - mean_{j != i} r_j`` = ``G/(G-1) · (r_i - mean_g)``.

    The leave-one-out baseline needs at least two completions per prompt.
    """
    rewards_BG = _as_float64_BG(rewards_BG)
    group_size = rewards_BG.shape[1]
    if group_size < MIN_GROUP_SIZE["rloo"]:
        raise ValueError(
            f"the 'rloo' advantage estimator needs at least 2 completions per prompt (its "
            f"baseline is the mean of the other G-1 rewards); got G = {group_size}. "
            f"Raise the number of generations per prompt or pick 'grpo'/'dr_grpo'."
        )
    others_mean_BG = (rewards_BG.sum(dim=1, keepdim=True) - rewards_BG) / (group_size - 1)
    advantages_BG = (rewards_BG - others_mean_BG).masked_fill(_constant_groups_B1(rewards_BG), 0.0)
    return advantages_BG.to(torch.float32)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp(
    rewards_BG: torch.Tensor,
    *,
    eps: float = 1e-6,
    std_unbiased: bool = True,
    group_baseline: bool = True,
    **kwargs,
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): whiten ``x`` over the whole batch of ``B·G`` completions.

    ``x = r - mean_g`` when ``group_baseline`` (the "REINFORCE++-baseline" variant) else ``x = r``;
    the advantage is ``(x - mean(x)) / (std(x) + eps)`` with mean and std taken over all ``B·G``
    entries of this call — pass the whole train batch, not a micro-batch.

    With ``group_baseline`` a constant group is exactly 0 (as for every estimator). Without it the
    batch mean is the only baseline, so a constant group gets the (non-zero) whitened value of its
    reward — that is the point of the variant. A batch whose ``x`` is constant gives zeros.
    No KL term is folded into the advantage here; KL belongs to the loss (``LossConfig.beta``).
    """
    rewards_BG = _as_float64_BG(rewards_BG)
    x_BG = _centered(rewards_BG) if group_baseline else rewards_BG
    if x_BG.numel() == 0 or bool(x_BG.max() == x_BG.min()):
        return torch.zeros_like(x_BG, dtype=torch.float32)
    std = x_BG.std(correction=1 if std_unbiased else 0)  # >= 2 entries here, since not constant
    whitened_BG = (x_BG - x_BG.mean()) / (std + eps)
    if group_baseline:
        whitened_BG = whitened_BG.masked_fill(_constant_groups_B1(rewards_BG), 0.0)
    return whitened_BG.to(torch.float32)


def compute_advantages(name: str, rewards_BG: torch.Tensor, **kwargs) -> torch.Tensor:
    """Look up estimator ``name`` (or ``"module:function"``) and apply it: ``[B, G]`` float32."""
    estimator = ADVANTAGE_ESTIMATORS.get(name)
    return estimator(rewards_BG, **kwargs)
