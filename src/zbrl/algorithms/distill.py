"""On-policy distillation: the per-token reverse KL to a teacher, as per-token advantages.

The student samples a response; the teacher scores every sampled token. The reverse KL
``KL(π_student ‖ π_teacher)`` summed over a response is estimated on the sampled tokens by
``Σ_t (log π_student(y_t | y_<t) - log π_teacher(y_t | y_<t))``; its policy gradient is the
REINFORCE gradient with the per-token reward ``-(log π_student - log π_teacher)``, each token's
reward its own (no return-to-go: a discount of zero). This is the estimator of Thinking
Machines' "On-Policy Distillation" (Lu and Thinking Machines Lab, 2025), which feeds
``-coef · (sampled logp - teacher logp)`` as the per-token advantage of an importance-sampled
policy-gradient loss; here the advantage goes through the run's policy loss (the PPO clip), so
stale samples keep their ratio and clip.

Mixed with an RL objective, each token's advantage is
``reward_coef · A_seq + coef · (teacher logp_t - behaviour logp_t)``, ``A_seq`` the advantage
estimator's sequence advantage (GRPO's group-normalised reward). Tokens outside the loss mask
(an environment's messages in multi-turn episodes) get no distillation advantage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistillWeights:
    """How the distillation advantage mixes with the estimator's (``algorithm.distill``)."""

    coef: float
    """Weight of ``teacher logp - behaviour logp`` per token."""
    reward_coef: float
    """Weight of the estimator's sequence advantage (0: distillation alone)."""


def distill_advantages(
    advantage: float,
    behaviour_logprobs_T: torch.Tensor,
    teacher_logprobs_T: torch.Tensor,
    loss_mask_T: torch.Tensor | None,
    *,
    coef: float,
    reward_coef: float,
) -> torch.Tensor:
    """float32 [T]: each response token's advantage (see the module docstring): zero outside
    ``loss_mask_T`` (None: every token is the model's)."""
    if behaviour_logprobs_T.shape != teacher_logprobs_T.shape:
        raise ValueError(
            f"teacher log-probs {tuple(teacher_logprobs_T.shape)} and behaviour log-probs "
            f"{tuple(behaviour_logprobs_T.shape)} must cover the same response tokens"
        )
    gap_T = teacher_logprobs_T.float() - behaviour_logprobs_T.float()
    out_T = reward_coef * float(advantage) + coef * gap_T
    if loss_mask_T is not None:
        out_T = torch.where(loss_mask_T.bool(), out_T, torch.zeros_like(out_T))
    return out_T


def reverse_kl_per_token(
    behaviour_logprobs_T: torch.Tensor,
    teacher_logprobs_T: torch.Tensor,
    loss_mask_T: torch.Tensor | None,
) -> tuple[float, int]:
    """The sampled-token reverse-KL estimate summed over the model's tokens, and their count
    (to be averaged over a batch)."""
    gap_T = behaviour_logprobs_T.float() - teacher_logprobs_T.float()
    if loss_mask_T is not None:
        gap_T = gap_T[loss_mask_T.bool()]
    return float(gap_T.sum()), int(gap_T.numel())
