"""Behaviour/trainer mismatch: how far the producer's log-probs are from the trainer's.

The producer records the log-prob of every sampled token under its inference engine (the
behaviour policy μ); the consumer recomputes the same tokens' log-probs with its own forward pass
(π). Even at equal weights the two differ: another kernel, another precision, another batching
(vLLM against transformers most of all). With ``Δ = log π(x) - log μ(x)`` per trained token and
the tokens drawn from μ:

- ``mismatch_abs_logp`` — mean ``|Δ|``;
- ``mismatch_k3`` — mean ``exp(Δ) - 1 - Δ``, Schulman's k3 estimate of ``KL(μ ‖ π)`` (>= 0);
- ``mismatch_ratio_max`` — the largest importance ratio ``exp(Δ)``.

The means are over the tokens of ``mask_BT``; the metric names are those the consumer logs (a
``_max`` suffix makes the step's metric the maximum over micro-batches, the others are
token-weighted means). ``Δ`` is clamped to ±20 before ``exp`` as everywhere else.
"""

from __future__ import annotations

import torch

from zbrl.algorithms.kl import KL_LOG_RATIO_CLAMP


def mismatch_metrics(
    trainer_logprobs_BT: torch.Tensor,
    behaviour_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
) -> dict[str, float]:
    """The three mismatch figures over the masked tokens (zeros when no token is masked in)."""
    if not trainer_logprobs_BT.shape == behaviour_logprobs_BT.shape == mask_BT.shape:
        raise ValueError(
            f"mismatch_metrics: shapes {tuple(trainer_logprobs_BT.shape)}, "
            f"{tuple(behaviour_logprobs_BT.shape)} and {tuple(mask_BT.shape)} differ"
        )
    mask = mask_BT.bool()
    if not bool(mask.any()):
        return {"mismatch_abs_logp": 0.0, "mismatch_k3": 0.0, "mismatch_ratio_max": 0.0}
    delta = (trainer_logprobs_BT.detach().float() - behaviour_logprobs_BT.float())[mask]
    delta = delta.clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return {
        "mismatch_abs_logp": float(delta.abs().mean()),
        "mismatch_k3": float((torch.expm1(delta) - delta).mean()),
        "mismatch_ratio_max": float(torch.exp(delta).max()),
    }
