"""Policy-gradient losses: ``LossInputs -> LossOutputs(loss, metrics)``, registered by name.

``ppo_clip`` — the PPO clipped surrogate (Schulman et al. 2017) with asymmetric clipping
(``clip_eps_low``/``clip_eps_high``, DAPO's "clip-higher"), optional dual-clip (Ye et al. 2020),
optional KL-to-reference penalty and entropy bonus. Per valid token, with
``ρ = exp(logπ - logπ_old)`` computed in float32 and ``A`` the advantage::

    pg   = -min(ρ·A, clip(ρ, 1-ε_low, 1+ε_high)·A)
    pg   = min(pg, -c·A)            where A < 0             (dual-clip, when dual_clip_c = c > 1)
    loss = pg + β·KL_k(π, π_ref) - entropy_coef·H

then reduced with :func:`~zbrl.algorithms.aggregation.aggregate` and the step's global
:class:`~zbrl.algorithms.aggregation.Normalisers`.

The log-ratio ``logπ - logπ_old`` is clamped to ``[-20, 20]`` before ``exp`` (such a token is
clipped anyway unless dual-clip is off and A < 0; the clamp keeps ρ finite so ``ρ·0`` is never NaN).

User losses: register with ``@POLICY_LOSSES.register("name")`` or pass ``"module:function"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from zbrl.algorithms.aggregation import Normalisers, aggregate
from zbrl.algorithms.kl import kl_estimate
from zbrl.config.algorithm import AlgorithmConfig, PpoClipLoss
from zbrl.registry import Registry

#: Bound on |logπ - logπ_old| before exp (ρ ∈ [e^-20, e^20]).
RATIO_LOG_CLAMP = 20.0


@dataclass
class LossInputs:
    """One micro-batch. All ``_BT`` tensors share shape [B, T] (response tokens, aligned).

    logprobs_BT: current policy log-probs of the sampled tokens (differentiable).
    old_logprobs_BT: behaviour-policy log-probs of the same tokens (the policy that sampled them).
    advantages_B_or_BT: one advantage per sequence [B] (broadcast over tokens) or per token [B, T].
    mask_BT: 1 (True) for tokens that are trained on, 0 for prompt/padding/filtered tokens.
    ref_logprobs_BT: reference-model log-probs; required when ``beta > 0``.
    entropy_BT: per-token policy entropy; required when ``entropy_coef > 0``, logged when given.
    """

    logprobs_BT: torch.Tensor
    old_logprobs_BT: torch.Tensor
    advantages_B_or_BT: torch.Tensor
    mask_BT: torch.Tensor
    ref_logprobs_BT: torch.Tensor | None = None
    entropy_BT: torch.Tensor | None = None


_PPO_CLIP = PpoClipLoss()
_ALGORITHM = AlgorithmConfig()


@dataclass
class LossConfig:
    """Knobs of the policy loss, filled from the run config's ``algorithm`` section.

    The defaults are read from the config models (``zbrl.config``), so they live in one place,
    and the values are validated there (bounds, names); this dataclass does not check them again.

    clip_eps_low / clip_eps_high: ratio clip range [1 - low, 1 + high].
    dual_clip_c: dual-clip constant c > 1 for negative advantages; None disables it.
    beta: weight of the KL-to-reference penalty (0 disables it and the reference model).
    kl_estimator: "k1", "k2" or "k3" (see :mod:`zbrl.algorithms.kl`).
    entropy_coef: weight of the entropy bonus (subtracted from the loss).
    aggregation: one of :data:`~zbrl.algorithms.aggregation.AGGREGATION_MODES`.
    options: free options of a user loss given by import path (``algorithm.policy_loss.options``).
    """

    clip_eps_low: float = _PPO_CLIP.clip_eps_low
    clip_eps_high: float = _PPO_CLIP.clip_eps_high
    dual_clip_c: float | None = _PPO_CLIP.dual_clip_c
    beta: float = _ALGORITHM.beta
    kl_estimator: str = _ALGORITHM.kl_estimator
    entropy_coef: float = _ALGORITHM.entropy_coef
    aggregation: str = _ALGORITHM.loss_aggregation
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class LossOutputs:
    """loss: differentiable scalar; metrics: python floats for logging (see ``ppo_clip``)."""

    loss: torch.Tensor
    metrics: dict[str, float]


PolicyLossFn = Callable[[LossInputs, LossConfig, Normalisers], LossOutputs]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def _check_shapes(inputs: LossInputs) -> None:
    shape = tuple(inputs.mask_BT.shape)
    if len(shape) != 2:
        raise ValueError(f"LossInputs.mask_BT must have shape [B, T]; got {shape}")
    for name in ("logprobs_BT", "old_logprobs_BT", "ref_logprobs_BT", "entropy_BT"):
        tensor = getattr(inputs, name)
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(
                f"LossInputs.{name} has shape {tuple(tensor.shape)}, expected {shape} "
                f"(same as mask_BT)"
            )
    adv_shape = tuple(inputs.advantages_B_or_BT.shape)
    if adv_shape not in (shape[:1], shape):
        raise ValueError(
            f"LossInputs.advantages_B_or_BT has shape {adv_shape}; expected [B] = {shape[:1]} "
            f"or [B, T] = {shape}"
        )


def _masked_mean(values_BT: torch.Tensor, valid_BT: torch.Tensor, count: torch.Tensor):
    return torch.where(valid_BT, values_BT.float(), 0.0).sum() / count


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(inputs: LossInputs, cfg: LossConfig, norm: Normalisers) -> LossOutputs:
    """PPO clipped surrogate (+ dual-clip, KL penalty, entropy bonus); see the module docstring.

    Metrics (means over this micro-batch's valid tokens; weight them by ``num_tokens`` to
    combine micro-batches; all 0.0 when there is no valid token):
    ``clip_frac_low`` (ρ < 1-ε_low and A < 0: the lower clip is active),
    ``clip_frac_high`` (ρ > 1+ε_high and A > 0), ``dual_clip_frac`` (A < 0 and the dual clip
    bounds the loss), ``ratio_mean``, ``ratio_max``, ``approx_kl`` (k3 estimate of
    KL(behaviour ‖ current) = ``(ρ - 1) - log ρ``, from tokens sampled by the behaviour policy),
    ``pg_loss`` (mean clipped surrogate), ``kl`` (vs reference, when ``beta > 0``),
    ``entropy`` (when ``entropy_BT`` is given), ``num_tokens``.
    """
    _check_shapes(inputs)
    valid_BT = inputs.mask_BT != 0
    logprobs_BT = inputs.logprobs_BT.float()
    old_logprobs_BT = inputs.old_logprobs_BT.detach().float()
    advantages_BT = inputs.advantages_B_or_BT.detach().float()
    if advantages_BT.dim() == 1:
        advantages_BT = advantages_BT.unsqueeze(1)
    advantages_BT = advantages_BT.expand_as(logprobs_BT)

    # Masked positions get log-ratio 0 so padding garbage (e.g. -inf) never reaches exp.
    log_ratio_BT = torch.where(valid_BT, logprobs_BT - old_logprobs_BT, 0.0)
    ratio_BT = torch.exp(log_ratio_BT.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    clipped_ratio_BT = ratio_BT.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    pg_BT = torch.maximum(-ratio_BT * advantages_BT, -clipped_ratio_BT * advantages_BT)

    negative_adv_BT = advantages_BT < 0
    if cfg.dual_clip_c is not None:
        dual_bound_BT = -cfg.dual_clip_c * advantages_BT
        dual_active_BT = negative_adv_BT & (pg_BT > dual_bound_BT) & valid_BT
        pg_BT = torch.where(negative_adv_BT, torch.minimum(pg_BT, dual_bound_BT), pg_BT)
    else:
        dual_active_BT = torch.zeros_like(valid_BT)

    loss_BT = pg_BT
    kl_BT = None
    if cfg.beta > 0:
        if inputs.ref_logprobs_BT is None:
            raise ValueError(
                "LossConfig.beta > 0 needs LossInputs.ref_logprobs_BT (reference-model "
                "log-probs); compute them with the reference model or set beta = 0"
            )
        # Both inputs are masked with ``where`` (as the ratio is): padding garbage in either
        # (NaN, -inf) would otherwise reach the gradient through the estimator's derivative.
        ref_logprobs_BT = torch.where(valid_BT, inputs.ref_logprobs_BT.detach().float(), 0.0)
        kl_BT = kl_estimate(
            torch.where(valid_BT, logprobs_BT, 0.0), ref_logprobs_BT, cfg.kl_estimator
        )
        loss_BT = loss_BT + cfg.beta * kl_BT
    if cfg.entropy_coef > 0:
        if inputs.entropy_BT is None:
            raise ValueError(
                "LossConfig.entropy_coef > 0 needs LossInputs.entropy_BT; compute it with "
                "logprobs_and_entropy(..., with_entropy=True) or set entropy_coef = 0"
            )
        loss_BT = loss_BT - cfg.entropy_coef * torch.where(valid_BT, inputs.entropy_BT.float(), 0.0)

    loss = aggregate(loss_BT, inputs.mask_BT, cfg.aggregation, norm)
    metrics = _ppo_metrics(
        inputs, cfg, valid_BT, ratio_BT, advantages_BT, dual_active_BT, pg_BT, kl_BT
    )
    return LossOutputs(loss=loss, metrics=metrics)


@torch.no_grad()
def _ppo_metrics(
    inputs: LossInputs,
    cfg: LossConfig,
    valid_BT: torch.Tensor,
    ratio_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    dual_active_BT: torch.Tensor,
    pg_BT: torch.Tensor,
    kl_BT: torch.Tensor | None,
) -> dict[str, float]:
    num_tokens = valid_BT.sum()
    count = num_tokens.clamp_min(1).float()
    clip_low_BT = (ratio_BT < 1.0 - cfg.clip_eps_low) & (advantages_BT < 0)
    clip_high_BT = (ratio_BT > 1.0 + cfg.clip_eps_high) & (advantages_BT > 0)
    # k3 of KL(behaviour ‖ current): the tokens were sampled from the behaviour policy, so the
    # estimator's "sampling" argument is old_logprobs and its "other" argument the current one.
    approx_kl_BT = kl_estimate(
        torch.where(valid_BT, inputs.old_logprobs_BT.float(), 0.0),
        torch.where(valid_BT, inputs.logprobs_BT.detach().float(), 0.0),
        "k3",
    )
    values = {
        "clip_frac_low": _masked_mean(clip_low_BT, valid_BT, count),
        "clip_frac_high": _masked_mean(clip_high_BT, valid_BT, count),
        "dual_clip_frac": _masked_mean(dual_active_BT, valid_BT, count),
        "ratio_mean": _masked_mean(ratio_BT, valid_BT, count),
        "ratio_max": torch.where(valid_BT, ratio_BT, 0.0).max() if valid_BT.numel() else count * 0,
        "approx_kl": _masked_mean(approx_kl_BT, valid_BT, count),
        "pg_loss": _masked_mean(pg_BT, valid_BT, count),
    }
    if kl_BT is not None:
        values["kl"] = _masked_mean(kl_BT, valid_BT, count)
    if inputs.entropy_BT is not None:
        values["entropy"] = _masked_mean(inputs.entropy_BT, valid_BT, count)
    values["num_tokens"] = num_tokens.float()
    names = list(values)
    floats = torch.stack([v.float().reshape(()) for v in values.values()]).tolist()  # one sync
    return dict(zip(names, floats, strict=True))


def compute_policy_loss(
    name: str, inputs: LossInputs, cfg: LossConfig, norm: Normalisers
) -> LossOutputs:
    """Look up loss ``name`` (or ``"module:function"``) and apply it."""
    return POLICY_LOSSES.get(name)(inputs, cfg, norm)
