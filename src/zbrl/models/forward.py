"""The trainer's forward pass of full rows, shared with the producer's exact log-probs.

The trainer computes a micro-batch of full rows (prompt + response, right-padded) as
``model(input_ids, attention_mask).logits[:, :-1]`` under :func:`autocast` to its compute dtype,
with the model's CPU attention put in float32 under bfloat16 autocast
(:func:`zbrl.models.cpu_attention.attention_in_float32`). ``rollout.exact_logprobs`` has the
producer score its sampled sequences with these same functions, in the same dtype, one row per
forward as the trainer then runs them (docs/precision.md, "Exact behaviour log-probs").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch


def autocast(device: torch.device, dtype: torch.dtype) -> AbstractContextManager[Any]:
    """The forward pass's context: ``torch.autocast`` to ``dtype`` on ``device``'s type, or
    nothing for float32."""
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def full_row_logits(
    model: torch.nn.Module, input_ids_BT: torch.Tensor, attention_BT: torch.Tensor
) -> torch.Tensor:
    """``model``'s logits of full rows, position ``t`` predicting token ``t + 1`` ([B, T-1, V])."""
    return model(input_ids=input_ids_BT, attention_mask=attention_BT).logits[:, :-1]


@contextmanager
def training_attention(
    model: torch.nn.Module, device: torch.device, dtype: torch.dtype
) -> Iterator[None]:
    """``model``'s attention as the trainer's engine sets it for ``dtype`` on ``device``, for
    the body only (an inference model keeps its own for generation)."""
    from zbrl.models.cpu_attention import attention_in_float32

    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    changed = attention_in_float32(model, device, dtype)
    try:
        yield
    finally:
        if changed:
            model.set_attn_implementation(before)


def trainer_temperature(temperature: float) -> float:
    """The sampling temperature as the trainer applies it: read back from the float32 tensor a
    train batch carries it in."""
    return float(torch.tensor(temperature, dtype=torch.float32))


@torch.no_grad()
def score_rows(
    model: torch.nn.Module,
    rows: list[tuple[list[int], torch.Tensor]],
    *,
    temperature: float,
    device: torch.device,
    dtype: torch.dtype,
    chunk_size: int,
) -> list[torch.Tensor]:
    """float32 [L] log-probs of each (prompt ids, response ids [L]) row's response tokens, as
    the trainer computes them for a micro-batch of that one row: the full row through
    :func:`full_row_logits` under :func:`autocast` to ``dtype`` with the trainer's attention,
    then :func:`zbrl.algorithms.logprobs.logprobs_and_entropy` outside autocast at
    ``temperature`` (:func:`trainer_temperature`) with the trainer's ``chunk_size``. One row
    per forward: the numbers do not depend on what else was sampled with it."""
    from zbrl.algorithms.logprobs import logprobs_and_entropy

    out = []
    with training_attention(model, device, dtype):
        for prompt, response in rows:
            ids_1T = torch.cat([torch.tensor(prompt, dtype=torch.long), response.cpu()])[None]
            ids_1T = ids_1T.to(device)
            with autocast(device, dtype):
                logits = full_row_logits(model, ids_1T, torch.ones_like(ids_1T))
            logp_1T, _ = logprobs_and_entropy(
                logits,
                ids_1T[:, 1:],
                temperature=trainer_temperature(temperature),
                chunk_size=chunk_size,
                with_entropy=True,
            )
            out.append(logp_1T[0, len(prompt) - 1 :].float().cpu())
    return out
