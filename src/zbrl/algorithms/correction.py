"""Off-policy correction: importance weights between the behaviour policy (the producer's, whose
log-probs come with each sample), the proximal policy (the trainer's at the start of the step) and
the policy being updated.

Three corrections (``algorithm.correction``), each at one of three levels
(``algorithm.correction_level``) and with a cap ``C > 1`` (``algorithm.correction_cap``):

``decoupled``  AReaL's decoupled PPO (Fu et al. 2025): the PPO clip is taken against the proximal
               policy, and the behaviour→proximal weight ``w = π_prox / π_behav``, truncated at
               ``C`` and never differentiated, multiplies the per-token policy loss.
               With ``π_prox = π_behav`` the weight is exactly 1 and the loss is plain PPO.
``tis``        Truncated importance sampling: no clip; the surrogate is ``-min(ρ, C)·A`` with
               ``ρ = π / π_behav`` and gradient ``-min(ρ, C)·A·∇log ρ`` (Ionides 2008; Espeholt et
               al. 2018's truncated ρ; Yao et al. 2025 for LLM RL). ``C = inf`` is plain IS.
``mis``        Masked importance sampling: the surrogate ``-ρ·A`` where ``ρ <= C``, and the token
               (or the whole sequence) dropped from the policy loss where ``ρ > C``.
               ``C = inf`` masks nothing.

Levels: ``token`` (one weight per token), ``sequence`` (``exp`` of the summed token log-ratios of
a sequence, shared by its tokens), ``geometric`` (``exp`` of their mean: the sequence weight's
geometric mean per token). Sequence-level surrogates pair naturally with the
``seq-mean-token-mean`` aggregation, which then averages one term per sequence.

The proximal policy is either recomputed by a no-grad forward pass at the start of the step or
approximated by :func:`loglinear_proximal` (AReaL's log-linear interpolation by policy version).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zbrl.algorithms.kl import kl_estimate

CORRECTIONS: tuple[str, ...] = ("none", "decoupled", "tis", "mis")
CORRECTION_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")

#: Bound on a (token or sequence) log-weight before exp (weights in [e^-20, e^20]).
LOG_WEIGHT_CLAMP = 20.0


@dataclass
class WeightStats:
    """Per-token tensors for the step's metrics (all ``[B, T]``, detached).

    weight_BT: the importance weight before the cap; over_cap_BT: True where it exceeds the cap
    (truncated for ``decoupled``/``tis``, masked for ``mis``).
    """

    weight_BT: torch.Tensor
    over_cap_BT: torch.Tensor


def level_log_ratio(log_ratio_BT: torch.Tensor, valid_BT: torch.Tensor, level: str) -> torch.Tensor:
    """The log-weight of each token at ``level``: the token's own log-ratio, the sum of its
    sequence's valid log-ratios (``sequence``) or their mean (``geometric``), broadcast to
    ``[B, T]``. Differentiable; invalid positions contribute 0."""
    masked_BT = torch.where(valid_BT, log_ratio_BT, 0.0)
    if level == "token":
        return masked_BT
    summed_B1 = masked_BT.sum(dim=1, keepdim=True)
    if level == "sequence":
        return summed_B1.expand_as(masked_BT)
    if level == "geometric":
        count_B1 = valid_BT.sum(dim=1, keepdim=True).clamp_min(1)
        return (summed_B1 / count_B1).expand_as(masked_BT)
    raise ValueError(f"unknown correction level {level!r}; choose one of {CORRECTION_LEVELS}")


def _exp(log_weight_BT: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_weight_BT.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP))


@torch.no_grad()
def behaviour_weight(
    behaviour_BT: torch.Tensor,
    proximal_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    level: str,
    cap: float,
) -> tuple[torch.Tensor, WeightStats]:
    """``min(π_prox / π_behav, cap)`` at ``level`` (``decoupled``); 1 at invalid positions."""
    log_ratio_BT = proximal_BT.float() - behaviour_BT.float()
    weight_BT = _exp(level_log_ratio(log_ratio_BT, valid_BT, level))
    weight_BT = torch.where(valid_BT, weight_BT, 1.0)
    over_BT = (weight_BT > cap) & valid_BT
    return weight_BT.clamp(max=cap), WeightStats(weight_BT, over_BT)


def is_surrogate(
    logprobs_BT: torch.Tensor,
    behaviour_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    *,
    masked: bool,
    level: str,
    cap: float,
) -> tuple[torch.Tensor, torch.Tensor, WeightStats]:
    """Per-token policy loss of ``tis`` (``masked=False``) or ``mis`` (``masked=True``).

    Returns ``(pg_BT, ratio_BT, stats)``: ``pg_BT`` is ``-min(ρ, cap)·A`` (value) with gradient
    ``-min(ρ, cap)·A·∇log ρ`` for ``tis``, and ``-ρ·A`` where ``ρ <= cap`` (0 elsewhere) for
    ``mis``; ``ratio_BT`` is the detached ``ρ`` at ``level``.
    """
    log_ratio_BT = torch.where(valid_BT, logprobs_BT - behaviour_BT.detach(), 0.0)
    ratio_BT = _exp(level_log_ratio(log_ratio_BT, valid_BT, level))
    over_BT = (ratio_BT.detach() > cap) & valid_BT
    if masked:
        pg_BT = torch.where(over_BT, 0.0, -ratio_BT * advantages_BT)
    else:
        # value -min(ρ, C)·A; d/dθ = -(min(ρ, C)/ρ)·A·dρ = -min(ρ, C)·A·∇log ρ
        scale_BT = (ratio_BT.clamp(max=cap) / ratio_BT).detach()
        pg_BT = -scale_BT * ratio_BT * advantages_BT
    stats = WeightStats(ratio_BT.detach(), over_BT)
    return pg_BT, ratio_BT.detach(), stats


def loglinear_proximal(
    behaviour_BT: torch.Tensor, current_BT: torch.Tensor, alpha: torch.Tensor
) -> torch.Tensor:
    """AReaL's log-linear approximation of the proximal log-probs (no forward pass):
    ``log π_prox ≈ log π_behav + α·(log π - log π_behav)``, where
    ``α = (v_prox - v_behav) / (v_current - v_behav)`` measures policy versions (see
    :func:`loglinear_alpha`): one ``α`` per sequence (``[B]``) or per token (``[B, T]``, for
    responses whose tokens come from several versions). Detached."""
    alpha = alpha.to(current_BT.device, torch.float32)
    alpha = alpha.view(-1, 1) if alpha.dim() == 1 else alpha
    behaviour_BT = behaviour_BT.detach().float()
    return behaviour_BT + alpha * (current_BT.detach().float() - behaviour_BT)


def loglinear_alpha(behind: torch.Tensor, updates_done: int) -> torch.Tensor:
    """``α`` of :func:`loglinear_proximal` for sequences (``[B]``) or tokens (``[B, T]``)
    generated ``behind`` optimizer steps before the step start, ``updates_done`` optimizer steps
    into the current batch: ``behind / (behind + updates_done)``, and 1 when both are 0 (the
    current policy *is* the proximal one)."""
    behind = behind.to(torch.float32)
    total = behind + updates_done
    return torch.where(total > 0, behind / total.clamp_min(1e-12), 1.0)


@torch.no_grad()
def correction_metrics(
    stats: WeightStats | None,
    valid_BT: torch.Tensor,
    behaviour_BT: torch.Tensor,
    proximal_BT: torch.Tensor | None,
    *,
    masked: bool,
) -> dict[str, torch.Tensor]:
    """``is_weight_mean``, ``is_weight_max`` (before the cap), ``is_capped_frac`` or
    ``is_masked_frac``, and ``behav_prox_k3`` (k3 of KL(behaviour ‖ proximal)) when a proximal
    policy was used; tensors (the caller syncs once)."""
    out: dict[str, torch.Tensor] = {}
    count = valid_BT.sum().clamp_min(1).float()
    if stats is not None:
        weight_BT = torch.where(valid_BT, stats.weight_BT.float(), 0.0)
        out["is_weight_mean"] = weight_BT.sum() / count
        out["is_weight_max"] = weight_BT.max() if weight_BT.numel() else count * 0
        share = stats.over_cap_BT.float().sum() / count
        out["is_masked_frac" if masked else "is_capped_frac"] = share
    if proximal_BT is not None:
        k3_BT = kl_estimate(
            torch.where(valid_BT, behaviour_BT.float(), 0.0),
            torch.where(valid_BT, proximal_BT.detach().float(), 0.0),
            "k3",
        )
        out["behav_prox_k3"] = torch.where(valid_BT, k3_BT, 0.0).sum() / count
    return out
