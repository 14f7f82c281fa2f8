"""The RL objective: advantages, policy loss, KL, aggregation, filtering and optimisation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from zbrl.config.base import Section
from zbrl.config.plugin import as_plugin_dict, check_import_path, plugin_union

AggregationMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
PresetName = Literal["grpo", "dapo", "dr_grpo", "rloo", "reinforce_pp"]

GROUP_ESTIMATORS = frozenset({"grpo", "dr_grpo", "rloo"})
"""Estimators whose baseline comes from the group: with G = 1 every advantage is zero."""


class LrScheduleConfig(Section):
    """Learning-rate schedule: linear warmup, then cosine decay (or constant)."""

    warmup_steps: int = Field(default=0, ge=0)
    """Optimizer steps of linear warmup from 0 to ``lr``."""
    decay: Literal["cosine", "constant"] = "cosine"
    """Shape after warmup."""
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    """Cosine floor as a fraction of ``lr``."""


class GrpoAdvantage(Section):
    """GRPO (Shao et al. 2024): ``(r - group mean) / (group std + eps)``."""

    type: Literal["grpo"] = "grpo"
    """Estimator discriminator."""
    eps: float = Field(default=1e-6, gt=0)
    """Epsilon added to the group standard deviation."""
    std_unbiased: bool = True
    """Use the unbiased (N-1) group standard deviation."""


class DrGrpoAdvantage(Section):
    """Dr.GRPO (Liu et al. 2025): ``r - group mean``, no division by the std; no options."""

    type: Literal["dr_grpo"] = "dr_grpo"
    """Estimator discriminator."""


class RlooAdvantage(Section):
    """RLOO (Ahmadian et al. 2024): leave-one-out baseline; needs G >= 2; no options."""

    type: Literal["rloo"] = "rloo"
    """Estimator discriminator."""


class ReinforcePPAdvantage(Section):
    """REINFORCE++ (Hu 2025): advantages whitened over the whole train batch."""

    type: Literal["reinforce_pp"] = "reinforce_pp"
    """Estimator discriminator."""
    group_baseline: bool = True
    """Subtract the group mean before batch whitening (the "REINFORCE++-baseline" variant)."""
    eps: float = Field(default=1e-6, gt=0)
    """Epsilon added to the batch standard deviation."""
    std_unbiased: bool = True
    """Use the unbiased (N-1) batch standard deviation."""


class ImportAdvantage(Section):
    """A user estimator ``fn(rewards_BG, **options) -> advantages_BG``, given by import path."""

    type: str
    """``package.module:function``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options passed to the function."""

    _check_type = field_validator("type")(classmethod(lambda cls, v: check_import_path(v)))


AdvantageConfig = plugin_union(
    GrpoAdvantage, DrGrpoAdvantage, RlooAdvantage, ReinforcePPAdvantage, ImportAdvantage
)


class PpoClipLoss(Section):
    """The PPO clipped surrogate with asymmetric clipping and optional dual-clip."""

    type: Literal["ppo_clip"] = "ppo_clip"
    """Loss discriminator."""
    clip_eps_low: float = Field(default=0.2, ge=0, lt=1)
    """Lower clip: the ratio is clipped below at 1 - clip_eps_low."""
    clip_eps_high: float = Field(default=0.2, ge=0)
    """Upper clip: the ratio is clipped above at 1 + clip_eps_high (DAPO clip-higher: 0.28)."""
    dual_clip_c: float | None = Field(default=None, gt=1)
    """Dual-clip constant c > 1 bounding the loss of negative advantages; None disables it."""


class ImportPolicyLoss(Section):
    """A user loss ``fn(inputs, loss_config, normalisers) -> LossOutputs``, by import path; its
    ``options`` reach it as ``loss_config.options``."""

    type: str
    """``package.module:function``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Free options of the user loss (``LossConfig.options``)."""

    _check_type = field_validator("type")(classmethod(lambda cls, v: check_import_path(v)))


PolicyLossConfig = plugin_union(PpoClipLoss, ImportPolicyLoss)


class AlgorithmConfig(Section):
    """Everything that defines the update rule."""

    preset: PresetName | None = None
    """Named preset expanded into the fields below (explicit values win); shown in the resolved
    config."""
    advantage: AdvantageConfig = Field(default_factory=GrpoAdvantage)
    """Advantage estimator (``type``: grpo, dr_grpo, rloo, reinforce_pp, or
    ``package.module:function``) with its own options."""
    policy_loss: PolicyLossConfig = Field(default_factory=PpoClipLoss)
    """Policy loss (``type``: ppo_clip or ``package.module:function``) with its own options."""
    beta: float = Field(default=0.0, ge=0)
    """KL penalty coefficient to the reference policy; 0 disables the reference model."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator of the penalty (Schulman's k1, k2, k3)."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Entropy bonus coefficient."""
    loss_aggregation: AggregationMode = "token-mean"
    """How per-token losses become one number (normalised over the whole optimizer step)."""
    filter_range: tuple[float, float] | None = None
    """Keep only groups whose mean answer accuracy lies strictly inside (low, high); [0, 1] keeps
    exactly the groups with 0 < correct < G (DAPO's dynamic sampling) for every group size."""
    filter_truncated_response: bool = False
    """Exclude truncated responses from the loss."""
    dynamic_batching: bool = True
    """Filter groups in the buffer and fill each train batch with effective groups only."""
    lr: float = Field(default=1e-6, gt=0)
    """Peak learning rate (AdamW)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_norm: float = Field(default=1.0, gt=0)
    """Gradient-norm clipping threshold."""
    lr_schedule: LrScheduleConfig = Field(default_factory=LrScheduleConfig)
    """Warmup and decay of the learning rate."""

    @field_validator("advantage", mode="before")
    @classmethod
    def _advantage_shorthand(cls, value: Any) -> Any:
        return as_plugin_dict(value, GrpoAdvantage)

    @field_validator("policy_loss", mode="before")
    @classmethod
    def _loss_shorthand(cls, value: Any) -> Any:
        return as_plugin_dict(value, PpoClipLoss)

    @field_validator("filter_range")
    @classmethod
    def _check_filter_range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None:
            low, high = value
            if not 0.0 <= low < high <= 1.0:
                raise ValueError(
                    f"filter_range must satisfy 0 <= low < high <= 1, got {list(value)}; "
                    "for example [0, 1] keeps groups that are neither all right nor all wrong"
                )
        return value
