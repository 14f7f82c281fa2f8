"""PPO's critic side: token rewards, GAE, the clipped value loss and explained variance.

Per response (tokens ``t = 0 .. L-1``, values ``V_t`` of the state before token ``t``; the end of a
response is terminal, ``V_L = 0``; a truncated response is treated the same way)::

    r_t   = -β·(log π_behav(t) - log π_ref(t))  + [t = L-1]·R     (the KL term only when folded in)
    δ_t   = r_t + γ·V_{t+1} - V_t
    A_t   = δ_t + γλ·A_{t+1}                    (Schulman et al. 2016, GAE)
    ret_t = A_t + V_t                           (the value target)

With ``γ = λ = 1`` the advantage is the return minus the value: ``A_t = Σ_{k≥t} r_k - V_t``.

Value loss (Schulman et al. 2017, as in PPO2's clipped value function), per valid token with
``V_old`` the step-start values::

    V_clip = V_old + clip(V - V_old, -c, c)
    ℓ_V    = ½ · max((V - ret)², (V_clip - ret)²)          (½ (V - ret)² when c is None)

reduced with :func:`~zbrl.algorithms.aggregation.aggregate` like the policy loss.
"""

from __future__ import annotations

import torch

from zbrl.algorithms.aggregation import Normalisers, aggregate


def token_rewards(
    rewards_B: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    kl_coef: float = 0.0,
    behaviour_BT: torch.Tensor | None = None,
    ref_BT: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B, T]`` float32 token rewards: each sequence's reward on its last valid token, minus
    ``kl_coef·(log π_behav - log π_ref)`` on every valid token when ``kl_coef > 0``."""
    valid_BT = mask_BT != 0
    rewards_BT = torch.zeros(valid_BT.shape, dtype=torch.float32, device=valid_BT.device)
    positions_BT = torch.arange(valid_BT.shape[1], device=valid_BT.device).expand_as(valid_BT)
    last_B = torch.where(valid_BT, positions_BT, -1).amax(dim=1)
    has_B = last_B >= 0
    rows_B = torch.arange(valid_BT.shape[0], device=valid_BT.device)[has_B]
    rewards_BT[rows_B, last_B[has_B]] = rewards_B.float().to(valid_BT.device)[has_B]
    if kl_coef > 0:
        if behaviour_BT is None or ref_BT is None:
            raise ValueError("a KL in the reward needs behaviour and reference log-probs")
        kl_BT = torch.where(valid_BT, behaviour_BT.float() - ref_BT.float(), 0.0)
        rewards_BT = rewards_BT - kl_coef * kl_BT
    return rewards_BT


def gae(
    rewards_BT: torch.Tensor,
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages_BT, returns_BT), float32, 0 at invalid positions. The valid tokens of a row
    must be contiguous (one response); the recursion runs backwards over ``T``."""
    valid_BT = mask_BT != 0
    rewards_BT = torch.where(valid_BT, rewards_BT.float(), 0.0)
    values_BT = torch.where(valid_BT, values_BT.detach().float(), 0.0)
    advantages_BT = torch.zeros_like(rewards_BT)
    next_value_B = torch.zeros_like(rewards_BT[:, 0])
    running_B = torch.zeros_like(next_value_B)
    for t in reversed(range(rewards_BT.shape[1])):
        valid_B = valid_BT[:, t]
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
        running_B = torch.where(valid_B, delta_B + gamma * lam * running_B, 0.0)
        next_value_B = torch.where(valid_B, values_BT[:, t], 0.0)
        advantages_BT[:, t] = running_B
    return advantages_BT, torch.where(valid_BT, advantages_BT + values_BT, 0.0)


def whiten(values_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the valid tokens (population std); 0 elsewhere."""
    valid_BT = mask_BT != 0
    count = valid_BT.sum().clamp_min(1)
    mean = torch.where(valid_BT, values_BT, 0.0).sum() / count
    var = torch.where(valid_BT, (values_BT - mean).square(), 0.0).sum() / count
    return torch.where(valid_BT, (values_BT - mean) / (var.sqrt() + eps), 0.0)


def value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip: float | None,
    aggregation: str,
    norm: Normalisers,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped value loss (module docstring) and its metrics (``value_loss``: mean per-token
    loss, ``value_clip_frac``: share of tokens where the clipped term is the larger one)."""
    valid_BT = mask_BT != 0
    values_BT = torch.where(valid_BT, values_BT.float(), 0.0)
    old_BT = torch.where(valid_BT, old_values_BT.detach().float(), 0.0)
    returns_BT = torch.where(valid_BT, returns_BT.detach().float(), 0.0)
    unclipped_BT = (values_BT - returns_BT).square()
    if clip is None:
        loss_BT = 0.5 * unclipped_BT
        clipped_active_BT = torch.zeros_like(valid_BT)
    else:
        clipped_BT = old_BT + (values_BT - old_BT).clamp(-clip, clip)
        clipped_sq_BT = (clipped_BT - returns_BT).square()
        loss_BT = 0.5 * torch.maximum(unclipped_BT, clipped_sq_BT)
        clipped_active_BT = (clipped_sq_BT > unclipped_BT) & valid_BT
    count = valid_BT.sum().clamp_min(1).float()
    metrics = {
        "value_loss": (torch.where(valid_BT, loss_BT, 0.0).sum() / count).detach(),
        "value_clip_frac": clipped_active_BT.float().sum() / count,
    }
    return aggregate(loss_BT, mask_BT, aggregation, norm), metrics


def explained_variance(
    values_BT: torch.Tensor, returns_BT: torch.Tensor, mask_BT: torch.Tensor
) -> float:
    """``1 - Var(ret - V) / Var(ret)`` over the valid tokens (1: perfect, 0: no better than a
    constant, < 0: worse); 0.0 when the returns do not vary."""
    valid_BT = mask_BT != 0
    returns = returns_BT[valid_BT].double()
    if returns.numel() < 2:
        return 0.0
    var_returns = returns.var(correction=0)
    if float(var_returns) == 0.0:
        return 0.0
    residual = returns - values_BT[valid_BT].double()
    return float(1.0 - residual.var(correction=0) / var_returns)
