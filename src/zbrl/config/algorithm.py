"""The RL objective: advantages, policy loss, KL, aggregation, filtering and optimisation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from zbrl.config.base import Section
from zbrl.config.model import EMBEDDED, WarmStartConfig
from zbrl.config.plugin import as_plugin_dict, check_import_path, plugin_union

AggregationMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
PresetName = Literal["grpo", "dapo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "ppo"]
CorrectionName = Literal["none", "decoupled", "tis", "mis"]
CorrectionLevel = Literal["token", "sequence", "geometric"]

CORRECTIONS_WITH_PROXIMAL = frozenset({"decoupled"})
"""Corrections that need the proximal policy (the trainer's policy at the start of the step)."""

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


class GaeAdvantage(Section):
    """GAE (Schulman et al. 2016) over response tokens with a learned critic (``algorithm.critic``):
    ``δ_t = r_t + γ V_{t+1} - V_t``, ``A_t = δ_t + γλ A_{t+1}``, the end of a response terminal."""

    type: Literal["gae"] = "gae"
    """Estimator discriminator."""
    gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount γ per token."""
    lam: float = Field(default=0.95, ge=0, le=1)
    """GAE λ (1: Monte-Carlo returns minus values; 0: one-step TD)."""
    whiten: bool = True
    """Whiten the advantages over the valid tokens of the whole train batch."""
    kl_in_reward: bool = False
    """Fold ``algorithm.beta`` times the per-token KL (k1: behaviour minus reference log-prob)
    into the token rewards instead of adding a KL penalty to the loss."""


AdvantageConfig = plugin_union(
    GrpoAdvantage,
    DrGrpoAdvantage,
    RlooAdvantage,
    ReinforcePPAdvantage,
    GaeAdvantage,
    ImportAdvantage,
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


class GspoLoss(Section):
    """GSPO (Zheng et al. 2025): the PPO clip on the sequence ratio
    ``s = exp(mean_t log(π/π_old))``, every token of a sequence sharing its clipped surrogate."""

    type: Literal["gspo"] = "gspo"
    """Loss discriminator."""
    clip_eps_low: float = Field(default=3e-4, ge=0, lt=1)
    """Lower clip of the sequence ratio (the paper uses 3e-4)."""
    clip_eps_high: float = Field(default=4e-4, ge=0)
    """Upper clip of the sequence ratio (the paper uses 4e-4)."""


class ImportPolicyLoss(Section):
    """A user loss ``fn(inputs, loss_config, normalisers) -> LossOutputs``, by import path; its
    ``options`` reach it as ``loss_config.options``."""

    type: str
    """``package.module:function``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Free options of the user loss (``LossConfig.options``)."""

    _check_type = field_validator("type")(classmethod(lambda cls, v: check_import_path(v)))


PolicyLossConfig = plugin_union(PpoClipLoss, GspoLoss, ImportPolicyLoss)


class CriticConfig(Section):
    """The value model of PPO with GAE: the policy's backbone (a separate copy, loaded from the
    same checkpoint) with a scalar head, trained by the consumer in the same step as the policy
    with its own AdamW optimizer (constant learning rate)."""

    lr: float = Field(default=1e-4, gt=0)
    """Critic learning rate."""
    value_clip: float | None = Field(default=0.2, gt=0)
    """Clip of the new values around the step-start values in the value loss; None: unclipped."""
    max_norm: float = Field(default=1.0, gt=0)
    """Critic gradient-norm clipping threshold."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Critic AdamW weight decay."""


def _teacher_warm_start() -> WarmStartConfig:
    return WarmStartConfig(steps=500, stop_at_accuracy=None)


class DistillConfig(Section):
    """On-policy distillation: a teacher scores every token the student sampled, and the
    student minimises the per-token reverse KL to it, estimated on the sampled token
    (docs/algorithms.md, "On-policy distillation")."""

    teacher: str
    """The teacher: a model directory, a Hub id or a pulled model's name (run in-process on
    each producer with transformers, in ``rollout.inference_dtype``), or ``embedded`` (the
    embedded model's warm start trained further, ``teacher_warm_start``). It must share the
    student's tokenizer."""
    coef: float = Field(default=1.0, gt=0)
    """Weight of the per-token distillation advantage ``teacher logp - student logp`` of each
    sampled token."""
    reward_coef: float = Field(default=0.0, ge=0)
    """Weight of the advantage estimator's (GRPO's) sequence advantage added to every token's;
    0: distillation alone (rewards are still computed and reported)."""
    batch_size: int = Field(default=32, ge=1)
    """Sequences per teacher forward pass."""
    teacher_warm_start: WarmStartConfig = Field(default_factory=_teacher_warm_start)
    """``teacher: embedded`` only: the supervised training of the teacher (the same builder and
    cache as ``model.warm_start``; by default 500 steps, no early stop)."""

    @property
    def embedded_teacher(self) -> bool:
        return self.teacher == EMBEDDED

    @field_validator("teacher")
    @classmethod
    def _check_teacher(cls, value: str) -> str:
        if value.startswith(("http://", "https://")):
            raise ValueError(
                f"algorithm.distill.teacher={value!r}: a teacher behind an endpoint is not "
                "supported; the teacher runs in-process with transformers: give its model "
                "directory, Hub id or pulled name (or `embedded`)"
            )
        return value


class AlgorithmConfig(Section):
    """Everything that defines the update rule."""

    preset: PresetName | None = None
    """Named preset expanded into the fields below (explicit values win); shown in the resolved
    config."""
    advantage: AdvantageConfig = Field(default_factory=GrpoAdvantage)
    """Advantage estimator (``type``: grpo, dr_grpo, rloo, reinforce_pp, or
    ``package.module:function``) with its own options."""
    policy_loss: PolicyLossConfig = Field(default_factory=PpoClipLoss)
    """Policy loss (``type``: ppo_clip, gspo or ``package.module:function``) with its own
    options."""
    correction: CorrectionName = "none"
    """Off-policy correction for samples a different (older) policy generated: ``none``;
    ``decoupled`` (AReaL: clip against the proximal policy, the behaviour→proximal weight
    truncated at ``correction_cap`` multiplies the loss); ``tis`` / ``mis`` (the clip replaced
    by the importance ratio to the behaviour policy, truncated at / masked above the cap)."""
    correction_level: CorrectionLevel = "token"
    """Where the correction's importance weight is taken: per ``token``, per ``sequence``
    (exp of the summed token log-ratios) or ``geometric`` (their per-sequence geometric mean)."""
    correction_cap: float = Field(default=2.0, gt=0)
    """Cap C > 1 on the importance weight (truncated at C, or the token/sequence masked above
    it for ``mis``); ``inf`` disables it."""
    proximal: Literal["recompute", "loglinear"] = "recompute"
    """How ``decoupled`` gets the proximal log-probs: a no-grad forward pass of the step-start
    policy (``recompute``), or AReaL's log-linear interpolation between the behaviour and the
    current log-probs by policy version (``loglinear``, no extra pass)."""
    ppo_epochs: int = Field(default=1, ge=1)
    """Passes over each train batch (each pass one optimizer step per mini-batch)."""
    critic: CriticConfig | None = None
    """The value model; required by (and only used with) ``advantage.type=gae``."""
    distill: DistillConfig | None = None
    """On-policy distillation from a teacher (alone, or mixed with the advantage estimator's
    objective by ``distill.reward_coef``); None: off."""
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
