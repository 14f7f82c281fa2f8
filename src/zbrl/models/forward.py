"""The trainer's forward pass of full rows, shared with the producer's exact log-probs.

The trainer computes a micro-batch of full rows (prompt + response, right-padded) as
``model(input_ids, attention_mask).logits[:, :-1]`` under :func:`autocast` to its compute dtype,
with the model's CPU attention put in float32 under bfloat16 autocast
(:func:`zbrl.models.cpu_attention.attention_in_float32`). ``rollout.exact_logprobs`` has the
producer score its sampled sequences with these same functions, in the same dtype, one group
per forward as the trainer then runs them (docs/precision.md, "Exact behaviour log-probs").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from zbrl.models.moe import forward_kwargs


def autocast(device: torch.device, dtype: torch.dtype) -> AbstractContextManager[Any]:
    """The forward pass's context: ``torch.autocast`` to ``dtype`` on ``device``'s type, or
    nothing for float32."""
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def full_row_logits(
    model: torch.nn.Module, input_ids_BT: torch.Tensor, attention_BT: torch.Tensor
) -> torch.Tensor:
    """``model``'s logits of full rows, position ``t`` predicting token ``t + 1`` ([B, T-1, V])
    (an MoE model's own router loss off: :func:`zbrl.models.moe.forward_kwargs`)."""
    out = model(input_ids=input_ids_BT, attention_mask=attention_BT, **forward_kwargs(model))
    return out.logits[:, :-1]


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


def right_padded(sequences: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Full rows (1-D int64 tensors) right-padded with ``pad_id`` to the longest: the ids and
    the attention mask ``[B, T]``, as the trainer lays out a micro-batch of full rows."""
    lengths = [int(seq.numel()) for seq in sequences]
    width = max(lengths)
    ids_BT = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for b, seq in enumerate(sequences):
        ids_BT[b, : lengths[b]] = seq
    attention_BT = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids_BT, attention_BT


@torch.no_grad()
def score_rows(
    model: torch.nn.Module,
    rows: list[tuple[list[int], torch.Tensor]],
    *,
    pad_id: int,
    temperature: float,
    device: torch.device,
    dtype: torch.dtype,
    chunk_size: int,
) -> list[torch.Tensor]:
    """float32 [L] log-probs of each (prompt ids, response ids [L]) row's response tokens, as
    the trainer computes them for a micro-batch of exactly these rows: the rows right-padded
    (:func:`right_padded`) through :func:`full_row_logits` under :func:`autocast` to ``dtype``
    with the trainer's attention, then :func:`zbrl.algorithms.logprobs.logprobs_and_entropy`
    outside autocast at ``temperature`` (:func:`trainer_temperature`) with the trainer's
    ``chunk_size``, all in one forward pass."""
    from zbrl.algorithms.logprobs import logprobs_and_entropy

    full = [torch.cat([torch.tensor(p, dtype=torch.long), r.cpu()]) for p, r in rows]
    ids_BT, attention_BT = right_padded(full, pad_id)
    ids_BT, attention_BT = ids_BT.to(device), attention_BT.to(device)
    with training_attention(model, device, dtype):
        with autocast(device, dtype):
            logits = full_row_logits(model, ids_BT, attention_BT)
        logp_BT, _ = logprobs_and_entropy(
            logits,
            ids_BT[:, 1:],
            temperature=trainer_temperature(temperature),
            chunk_size=chunk_size,
            with_entropy=True,
        )
    return [
        logp_BT[b, len(p) - 1 : len(p) - 1 + int(r.numel())].float().cpu()
        for b, (p, r) in enumerate(rows)
    ]
