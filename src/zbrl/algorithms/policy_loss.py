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

Off-policy correction (``LossConfig.correction``, see :mod:`zbrl.algorithms.correction`):
``decoupled`` takes the clip against ``LossInputs.proximal_logprobs_BT`` and multiplies ``pg`` by
the capped behaviour→proximal weight; ``tis`` / ``mis`` replace the clip by the truncated / masked
ratio to the behaviour policy (``ppo_clip`` only). ``none`` is the loss above, unchanged.

``gspo`` — GSPO (Zheng et al. 2025) in its token form: the sequence ratio
``s = exp(mean_t log(π/π_old))`` is clipped as PPO clips ``ρ``; each token carries
``s_t = sg[s]·π_t/sg[π_t]`` (value ``s``, gradient ``s·∇log π_t``), so with one advantage per
sequence and ``seq-mean-token-mean`` it is the paper's sequence objective.

User losses: register with ``@POLICY_LOSSES.register("name")`` or pass ``"module:function"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch

from zbrl.algorithms.aggregation import Normalisers, aggregate
from zbrl.algorithms.correction import (
    WeightStats,
    behaviour_weight,
    correction_metrics,
    is_surrogate,
)
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
    proximal_logprobs_BT: the proximal policy's log-probs (the trainer's policy at the start of
        the step); required by ``correction="decoupled"``.
    """

    logprobs_BT: torch.Tensor
    old_logprobs_BT: torch.Tensor
    advantages_B_or_BT: torch.Tensor
    mask_BT: torch.Tensor
    ref_logprobs_BT: torch.Tensor | None = None
    entropy_BT: torch.Tensor | None = None
    proximal_logprobs_BT: torch.Tensor | None = None


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
    correction / correction_level / correction_cap: off-policy correction (see
        :mod:`zbrl.algorithms.correction`).
    options: free options of a user loss given by import path (``algorithm.policy_loss.options``).
    """

    clip_eps_low: float = _PPO_CLIP.clip_eps_low
    clip_eps_high: float = _PPO_CLIP.clip_eps_high
    dual_clip_c: float | None = _PPO_CLIP.dual_clip_c
    beta: float = _ALGORITHM.beta
    kl_estimator: str = _ALGORITHM.kl_estimator
    entropy_coef: float = _ALGORITHM.entropy_coef
    aggregation: str = _ALGORITHM.loss_aggregation
    correction: str = _ALGORITHM.correction
    correction_level: str = _ALGORITHM.correction_level
    correction_cap: float = _ALGORITHM.correction_cap
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
    names = ("logprobs_BT", "old_logprobs_BT", "ref_logprobs_BT", "entropy_BT")
    for name in (*names, "proximal_logprobs_BT"):
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
    """PPO clipped surrogate (+ dual-clip, KL penalty, entropy bonus, off-policy correction);
    see the module docstring.

    Metrics (means over this micro-batch's valid tokens; weight them by ``num_tokens`` to
    combine micro-batches; all 0.0 when there is no valid token):
    ``clip_frac_low`` (ρ < 1-ε_low and A < 0: the lower clip is active),
    ``clip_frac_high`` (ρ > 1+ε_high and A > 0), ``dual_clip_frac`` (A < 0 and the dual clip
    bounds the loss), ``ratio_mean``, ``ratio_max`` (ρ against the clip anchor: the behaviour
    policy, or the proximal one for ``decoupled``), ``approx_kl`` (k3 estimate of
    KL(behaviour ‖ current) = ``(ρ - 1) - log ρ``, from tokens sampled by the behaviour policy),
    ``pg_loss`` (mean clipped surrogate), ``kl`` (vs reference, when ``beta > 0``),
    ``entropy`` (when ``entropy_BT`` is given), ``num_tokens``; with a correction also
    ``is_weight_mean``, ``is_weight_max``, ``is_capped_frac`` or ``is_masked_frac`` and, for
    ``decoupled``, ``behav_prox_k3``.
    """
    _check_shapes(inputs)
    prepared = _prepared(inputs)
    valid_BT, logprobs_BT, advantages_BT = prepared
    if cfg.correction in ("tis", "mis"):
        pg_BT, ratio_BT, stats = is_surrogate(
            logprobs_BT,
            inputs.old_logprobs_BT.float(),
            advantages_BT,
            valid_BT,
            masked=cfg.correction == "mis",
            level=cfg.correction_level,
            cap=cfg.correction_cap,
        )
        no_dual_BT = torch.zeros_like(valid_BT)
        return _penalised_loss(inputs, cfg, norm, prepared, ratio_BT, no_dual_BT, pg_BT, stats)
    anchor_BT = _clip_anchor(inputs, cfg)
    # Masked positions get log-ratio 0 so padding garbage (e.g. -inf) never reaches exp.
    log_ratio_BT = torch.where(valid_BT, logprobs_BT - anchor_BT, 0.0)
    ratio_BT = torch.exp(log_ratio_BT.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    return _clipped_loss(inputs, cfg, norm, prepared, ratio_BT, clip=cfg)


@POLICY_LOSSES.register("gspo")
def gspo(inputs: LossInputs, cfg: LossConfig, norm: Normalisers) -> LossOutputs:
    """GSPO, token form (see the module docstring): the PPO clip of ``ppo_clip`` applied to the
    per-sequence geometric-mean ratio. Same metrics as ``ppo_clip`` (clip fractions and ratios
    of the sequence ratio, counted per token). ``decoupled`` anchors the ratio at the proximal
    policy and weights by the capped behaviour→proximal weight; ``tis``/``mis`` are refused."""
    _check_shapes(inputs)
    if cfg.correction in ("tis", "mis"):
        raise ValueError(
            f"gspo clips its own sequence ratio; correction={cfg.correction!r} does not apply "
            "(use 'decoupled' or 'none')"
        )
    prepared = _prepared(inputs)
    valid_BT, logprobs_BT, _ = prepared
    anchor_BT = _clip_anchor(inputs, cfg)
    log_ratio_BT = torch.where(valid_BT, logprobs_BT - anchor_BT, 0.0)
    count_B1 = valid_BT.sum(dim=1, keepdim=True).clamp_min(1)
    seq_log_ratio_B1 = (log_ratio_BT.sum(dim=1, keepdim=True) / count_B1).detach()
    # value exp(mean log ratio), gradient exp(mean log ratio)·∇log π_t per token
    token_log_ratio_BT = seq_log_ratio_B1 + logprobs_BT - logprobs_BT.detach()
    token_log_ratio_BT = torch.where(valid_BT, token_log_ratio_BT, 0.0)
    ratio_BT = torch.exp(token_log_ratio_BT.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP))
    no_dual = replace(cfg, dual_clip_c=None)
    return _clipped_loss(inputs, cfg, norm, prepared, ratio_BT, clip=no_dual)


def _clipped_loss(
    inputs: LossInputs,
    cfg: LossConfig,
    norm: Normalisers,
    prepared: _Prepared,
    ratio_BT: torch.Tensor,
    *,
    clip: LossConfig,
) -> LossOutputs:
    """The surrogate of ``ratio_BT`` clipped as ``clip`` says, weighted by the behaviour
    correction of ``cfg``, with the KL and entropy terms (``ppo_clip`` and ``gspo``)."""
    valid_BT, _, advantages_BT = prepared
    pg_BT, dual_active_BT = _clipped_surrogate(ratio_BT, advantages_BT, valid_BT, clip)
    pg_BT, stats = _behaviour_weighted(pg_BT, inputs, cfg, valid_BT)
    return _penalised_loss(inputs, cfg, norm, prepared, ratio_BT, dual_active_BT, pg_BT, stats)


def _penalised_loss(
    inputs: LossInputs,
    cfg: LossConfig,
    norm: Normalisers,
    prepared: _Prepared,
    ratio_BT: torch.Tensor,
    dual_active_BT: torch.Tensor,
    pg_BT: torch.Tensor,
    stats: WeightStats | None,
) -> LossOutputs:
    """The clipped surrogate ``pg_BT`` with the KL and entropy terms, aggregated, and the
    PPO-family metrics (shared by ``ppo_clip`` and ``gspo``)."""
    valid_BT, logprobs_BT, advantages_BT = prepared
    loss_BT, kl_BT = _with_penalties(pg_BT, logprobs_BT, inputs, cfg, valid_BT)
    loss = aggregate(loss_BT, inputs.mask_BT, cfg.aggregation, norm)
    metrics = _ppo_metrics(
        inputs, cfg, valid_BT, ratio_BT, advantages_BT, dual_active_BT, pg_BT, kl_BT, stats
    )
    return LossOutputs(loss=loss, metrics=metrics)


class _Prepared(NamedTuple):
    """A micro-batch's tensors as every PPO-family loss reads them."""

    valid_BT: torch.Tensor
    logprobs_BT: torch.Tensor
    """float32."""
    advantages_BT: torch.Tensor
    """Detached float32, broadcast to [B, T]."""


def _prepared(inputs: LossInputs) -> _Prepared:
    """(valid_BT, float32 logprobs_BT, detached float32 advantages_BT broadcast to [B, T])."""
    valid_BT = inputs.mask_BT != 0
    logprobs_BT = inputs.logprobs_BT.float()
    advantages_BT = inputs.advantages_B_or_BT.detach().float()
    if advantages_BT.dim() == 1:
        advantages_BT = advantages_BT.unsqueeze(1)
    return _Prepared(valid_BT, logprobs_BT, advantages_BT.expand_as(logprobs_BT))


def _clip_anchor(inputs: LossInputs, cfg: LossConfig) -> torch.Tensor:
    """The log-probs the ratio is taken against: the proximal policy's for ``decoupled``, the
    behaviour policy's otherwise (detached, float32)."""
    if cfg.correction == "decoupled":
        if inputs.proximal_logprobs_BT is None:
            raise ValueError(
                "correction='decoupled' needs LossInputs.proximal_logprobs_BT (the step-start "
                "policy's log-probs); compute them or set correction='none'"
            )
        return inputs.proximal_logprobs_BT.detach().float()
    return inputs.old_logprobs_BT.detach().float()


def _clipped_surrogate(
    ratio_BT: torch.Tensor, advantages_BT: torch.Tensor, valid_BT: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token clipped surrogate, where the dual clip is active)."""
    clipped_ratio_BT = ratio_BT.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    pg_BT = torch.maximum(-ratio_BT * advantages_BT, -clipped_ratio_BT * advantages_BT)
    negative_adv_BT = advantages_BT < 0
    if cfg.dual_clip_c is None:
        return pg_BT, torch.zeros_like(valid_BT)
    dual_bound_BT = -cfg.dual_clip_c * advantages_BT
    dual_active_BT = negative_adv_BT & (pg_BT > dual_bound_BT) & valid_BT
    pg_BT = torch.where(negative_adv_BT, torch.minimum(pg_BT, dual_bound_BT), pg_BT)
    return pg_BT, dual_active_BT


def _behaviour_weighted(
    pg_BT: torch.Tensor, inputs: LossInputs, cfg: LossConfig, valid_BT: torch.Tensor
) -> tuple[torch.Tensor, WeightStats | None]:
    """``pg`` times the capped behaviour→proximal weight for ``decoupled``; unchanged otherwise."""
    if cfg.correction != "decoupled":
        return pg_BT, None
    weight_BT, stats = behaviour_weight(
        torch.where(valid_BT, inputs.old_logprobs_BT.float(), 0.0),
        torch.where(valid_BT, _clip_anchor(inputs, cfg), 0.0),
        valid_BT,
        cfg.correction_level,
        cfg.correction_cap,
    )
    return pg_BT * weight_BT, stats


def _with_penalties(
    pg_BT: torch.Tensor,
    logprobs_BT: torch.Tensor,
    inputs: LossInputs,
    cfg: LossConfig,
    valid_BT: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``pg + β·KL - entropy_coef·H`` per token, and the KL (None when ``beta`` is 0)."""
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
    return loss_BT, kl_BT


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
    stats: WeightStats | None = None,
) -> dict[str, float]:
    num_tokens = valid_BT.sum()
    count = num_tokens.clamp_min(1).float()
    ratio_BT = ratio_BT.detach()
    clip_low_BT = (ratio_BT < 1.0 - cfg.clip_eps_low) & (advantages_BT < 0)
    clip_high_BT = (ratio_BT > 1.0 + cfg.clip_eps_high) & (advantages_BT > 0)
    if cfg.correction in ("tis", "mis"):  # no clip: the cap bounds the ratio instead
        clip_low_BT = clip_high_BT = torch.zeros_like(valid_BT)
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
        "pg_loss": _masked_mean(pg_BT.detach(), valid_BT, count),
    }
    if kl_BT is not None:
        values["kl"] = _masked_mean(kl_BT.detach(), valid_BT, count)
    if inputs.entropy_BT is not None:
        values["entropy"] = _masked_mean(inputs.entropy_BT, valid_BT, count)
    if cfg.correction != "none":
        proximal_BT = inputs.proximal_logprobs_BT if cfg.correction == "decoupled" else None
        values.update(
            correction_metrics(
                stats,
                valid_BT,
                inputs.old_logprobs_BT,
                proximal_BT,
                masked=cfg.correction == "mis",
            )
        )
    values["num_tokens"] = num_tokens.float()
    names = list(values)
    floats = torch.stack([v.float().reshape(()) for v in values.values()]).tolist()  # one sync
    return dict(zip(names, floats, strict=True))


def compute_policy_loss(
    name: str, inputs: LossInputs, cfg: LossConfig, norm: Normalisers
) -> LossOutputs:
    """Look up loss ``name`` (or ``"module:function"``) and apply it."""
    return POLICY_LOSSES.get(name)(inputs, cfg, norm)
