"""What a train step computes once, at its start, before any update: the proximal policy's
log-probs (decoupled correction), the reference log-probs (KL folded into the reward), the critic's
values, and from them GAE advantages and value targets. No gradients; results are stored on the
rows (CPU, float32, one value per response token)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from zbrl.algorithms.gae import explained_variance, gae, token_rewards, whiten
from zbrl.training.engine.base import Engine
from zbrl.training.rows import MicroBatching, Row, collate, response_span, split

LogprobFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(logits_BTV, targets_BT, temperatures_B) -> logprobs_BT`` at each row's temperature."""


@dataclass(frozen=True)
class CriticSettings:
    """PPO's critic side (every field filled by ``zbrl.assembly.settings.critic_settings``).

    gamma / lam: GAE's γ and λ. whiten: whiten advantages over the batch's trained tokens.
    kl_coef: β of the KL folded into the token rewards (0: none). value_clip: the value loss's
    clip (None: unclipped). max_norm: the critic's gradient-norm clip.
    """

    gamma: float
    lam: float
    whiten: bool
    kl_coef: float
    value_clip: float | None
    max_norm: float


@torch.no_grad()
def annotate_step_start(
    engine: Engine,
    rows: list[Row],
    logprob_fn: LogprobFn,
    *,
    batching: MicroBatching,
    pad_id: int,
    proximal: bool,
    reference: bool,
    values: bool,
) -> None:
    """Fill ``proximal_logprobs`` / ``ref_logprobs`` / ``old_values`` of every row (those asked
    for) with one no-grad pass of the step-start models per micro-batch."""
    if not (proximal or reference or values):
        return
    dev = engine.device
    shared = batching.share_prompts or batching.packing  # both align targets with responses
    for micro_rows in split(rows, batching):
        mb = collate(micro_rows, pad_id, share_prompts=shared, packed=batching.packing)
        inputs = mb.model_inputs().to(dev)
        targets = mb.targets_BT.to(dev)
        outputs: dict[str, torch.Tensor] = {}
        if proximal:
            logits = engine.policy_logits(inputs)
            outputs["proximal_logprobs"] = logprob_fn(logits, targets, mb.temperatures_B)
        if reference:
            logits = engine.reference_logits(inputs)
            outputs["ref_logprobs"] = logprob_fn(logits, targets, mb.temperatures_B)
        if values:
            values_BT = engine.critic_values(inputs.input_ids_BT, inputs.attention_BT)
            outputs["old_values"] = values_BT[:, :-1]
        for name, tensor_BT in outputs.items():
            tensor_BT = tensor_BT.detach().float().cpu()
            for i, row in enumerate(micro_rows):
                setattr(row, name, tensor_BT[i, response_span(row, shared=shared)].clone())


def annotate_gae(rows: list[Row], settings: CriticSettings) -> dict[str, float]:
    """Per-token advantages and returns of every row from its reward and ``old_values`` (and
    ``ref_logprobs`` when the KL is folded into the reward); whitening and the explained variance
    over the trained rows of the whole batch. Returns ``explained_variance`` and
    ``return_mean``."""
    width = max(int(r.response_ids.numel()) for r in rows)
    n = len(rows)
    mask_NL = torch.zeros((n, width), dtype=torch.bool)
    values_NL = torch.zeros((n, width))
    behaviour_NL = torch.zeros((n, width))
    ref_NL = torch.zeros((n, width))
    model_NL = torch.zeros((n, width), dtype=torch.bool)  # the model's tokens (not an episode's
    for i, r in enumerate(rows):  # environment tokens: no KL there, outside whitening/metrics)
        length = int(r.response_ids.numel())
        mask_NL[i, :length] = True
        model_NL[i, :length] = True if r.loss_mask is None else r.loss_mask
        values_NL[i, :length] = r.old_values
        behaviour_NL[i, :length] = r.old_logprobs
        if settings.kl_coef > 0:
            ref_NL[i, :length] = torch.where(model_NL[i, :length], r.ref_logprobs, r.old_logprobs)
    rewards_NL = token_rewards(
        torch.tensor([r.reward for r in rows]),
        mask_NL,
        kl_coef=settings.kl_coef,
        behaviour_BT=behaviour_NL,
        ref_BT=ref_NL,
    )
    advantages_NL, returns_NL = gae(
        rewards_NL, values_NL, mask_NL, gamma=settings.gamma, lam=settings.lam
    )
    trained_NL = mask_NL & model_NL & torch.tensor([r.trained for r in rows]).view(-1, 1)
    if settings.whiten:
        advantages_NL = whiten(advantages_NL, trained_NL)
    for i, r in enumerate(rows):
        length = int(r.response_ids.numel())
        r.token_advantages = advantages_NL[i, :length].clone()
        r.returns = returns_NL[i, :length].clone()
    count = trained_NL.sum().clamp_min(1)
    return {
        "explained_variance": explained_variance(values_NL, returns_NL, trained_NL),
        "return_mean": float(torch.where(trained_NL, returns_NL, 0.0).sum() / count),
        "value_mean": float(torch.where(trained_NL, values_NL, 0.0).sum() / count),
    }
