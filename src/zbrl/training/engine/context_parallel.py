"""Context parallelism (Ulysses sequence parallelism) for the FSDP2 engine.

A *context-parallel group* of ``C`` consecutive ranks trains the same rows (one data-parallel
shard of the batch), each rank holding ``1/C`` of every sequence's tokens: a micro-batch's
``[B, T]`` full rows are right-padded to ``T' = C·S`` and rank ``r`` of the group runs positions
``[r·S, (r+1)·S)`` with their global position ids. Everything but attention is per token, so it
runs on the local ``S`` tokens alone; in each attention layer (:func:`ulysses_attention`, a
transformers attention function) an all-to-all turns the sequence-sharded ``q``/``k``/``v``
``[B, H, S, D]`` (all heads) into head-sharded full sequences ``[B, H/C, T', D]``, causal
attention runs on them, and an all-to-all turns the output back into the sequence-sharded
``[B, S, H, D]``. Activations, logits and attention scores per rank shrink by ``C``; the weights
do not (FSDP2 shards them).

Right padding needs no mask: a real token's causal window holds only tokens before it, all real;
the padding positions compute garbage that no loss or metric reads. So the function attends
causally without a mask. The shared-prompt layout (a prompt's key/value cache gathered to its
rows) is not supported: context parallelism takes full rows (``training.share_prompts`` must be
off; a config check says so).

Log-probs are computed from each rank's local logits on its local targets
(:meth:`SequenceShard.local`) and gathered to full ``[B, T]`` rows on every rank of the group
(:meth:`SequenceShard.gather`), whose backward keeps the local part only. Every rank of the group
then computes the same loss on the same rows: the gradient of the group's loss with respect to
its parameters is the sum of the ranks' gradients, each of which reaches the model through its
own tokens (and, through the all-to-alls, the other ranks' attention). FSDP2 shards over all
``world`` ranks and averages their gradients, so the engine still scales each rank's loss by the
world size (:class:`~zbrl.training.engine.ranked.RankedEngine`): the average over ``world`` ranks
of ``world ×`` each group-member's contribution is the sum over data-parallel groups of each
group's gradient, the gradient of the whole batch.

The heads must divide: ``num_attention_heads % C == 0``; key/value heads are split too when
``num_key_value_heads % C == 0``, else repeated to one per query head before the exchange (more
traffic, same math).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from transformers import AttentionInterface

ULYSSES = "zbrl_ulysses"
"""Name of :func:`ulysses_attention` in transformers' attention registry (the model's
``attn_implementation`` under context parallelism)."""
GROUP_KWARG = "context_parallel_group"
"""Model-call keyword carrying the context-parallel process group down to the attention
function (transformers passes a forward's extra keywords to every attention layer)."""


def register_ulysses() -> None:
    """Register :func:`ulysses_attention` as :data:`ULYSSES` (idempotent)."""
    AttentionInterface.register(ULYSSES, ulysses_attention)


def check_heads(config: Any, size: int) -> None:
    """ValueError unless the model's attention heads split over ``size`` ranks."""
    heads = config.num_attention_heads
    if heads % size:
        raise ValueError(
            f"training.engine.context_parallel_size={size} must divide the model's "
            f"num_attention_heads ({heads}): Ulysses gives each rank of a group whole heads; "
            f"choose a divisor of {heads}"
        )


class _Exchange(torch.autograd.Function):
    """All-to-all of ``[C, ...]``: block ``j`` goes to rank ``j`` of the group, which receives it
    as block ``i`` from rank ``i``. With equal blocks the exchange is its own adjoint, so the
    backward exchanges the gradient the same way."""

    @staticmethod
    def forward(ctx: Any, blocks: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        received = torch.empty_like(blocks, memory_format=torch.contiguous_format)
        dist.all_to_all_single(received, blocks.contiguous(), group=group)
        return received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _Exchange.apply(grad, ctx.group), None


def _seq_to_heads(x_BHSD: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``[B, H, S, D]`` (this rank's tokens, all heads) -> ``[B, H/C, C·S, D]`` (this rank's
    heads, every token in rank order)."""
    size = dist.get_world_size(group)
    b, h, s, d = x_BHSD.shape
    sends_CBhSD = x_BHSD.view(b, size, h // size, s, d).transpose(0, 1)
    received_CBhSD = _Exchange.apply(sends_CBhSD, group)  # block i: rank i's tokens
    return received_CBhSD.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * s, d)


def _heads_to_seq(x_BhTD: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The inverse of :func:`_seq_to_heads`: ``[B, H/C, C·S, D]`` -> ``[B, H, S, D]``."""
    size = dist.get_world_size(group)
    b, h, t, d = x_BhTD.shape
    sends_CBhSD = x_BhTD.view(b, h, size, t // size, d).permute(2, 0, 1, 3, 4)
    received_CBhSD = _Exchange.apply(sends_CBhSD, group)  # block i: rank i's heads
    return received_CBhSD.transpose(0, 1).reshape(b, size * h, t // size, d)


def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention over a context-parallel group (transformers' attention-function
    signature): ``query`` ``[B, H, S, D]`` and ``key``/``value`` ``[B, Hkv, S, D]`` hold this
    rank's ``S`` tokens; returns the attention output ``[B, S, H, D]`` of those tokens. The group
    comes in the forward's :data:`GROUP_KWARG` keyword."""
    group = kwargs.get(GROUP_KWARG)
    if group is None:
        raise ValueError(
            f"attn_implementation={ULYSSES!r} needs the context-parallel group: call the model "
            f"with {GROUP_KWARG}=... (zbrl.training.engine.context_parallel.SequenceShard.logits)"
        )
    if attention_mask is not None:
        raise ValueError(f"{ULYSSES} attends causally over right-padded rows; got a mask")
    size = dist.get_world_size(group)
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % size:  # too few key/value heads to split: one per query head
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    q_BhTD = _seq_to_heads(query, group)
    k_BkTD = _seq_to_heads(key, group)
    v_BkTD = _seq_to_heads(value, group)
    out_BhTD = torch.nn.functional.scaled_dot_product_attention(
        q_BhTD,
        k_BkTD,
        v_BkTD,
        dropout_p=dropout,
        is_causal=True,
        scale=scaling,
        enable_gqa=k_BkTD.shape[1] != q_BhTD.shape[1],
    )
    return _heads_to_seq(out_BhTD, group).transpose(1, 2).contiguous(), None


class _GatherSequence(torch.autograd.Function):
    """All-gather ``[B, S]`` parts along the sequence in rank order; the backward keeps this
    rank's part of the gradient (every rank computes the same function of the gathered tensor,
    so the part is this rank's whole share)."""

    @staticmethod
    def forward(ctx: Any, part_BS: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        parts = [torch.empty_like(part_BS) for _ in range(size)]
        dist.all_gather(parts, part_BS.contiguous(), group=group)
        ctx.span = (rank * part_BS.shape[1], (rank + 1) * part_BS.shape[1])
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx: Any, grad_BT: torch.Tensor) -> tuple[torch.Tensor, None]:
        start, stop = ctx.span
        return grad_BT[:, start:stop], None


@dataclass(frozen=True)
class SequenceShard:
    """This rank's share of every sequence in its context-parallel ``group`` (see the module
    docstring): ``rank`` of ``size`` consecutive ranks."""

    group: dist.ProcessGroup
    rank: int
    size: int

    def span(self, width: int) -> slice:
        """This rank's positions of a row of ``width`` tokens padded to a multiple of
        :attr:`size`."""
        per_rank = -(-width // self.size)
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def _padded(self, x_BT: torch.Tensor, width: int) -> torch.Tensor:
        per_rank = -(-width // self.size)
        return torch.nn.functional.pad(x_BT, (0, per_rank * self.size - x_BT.shape[1]))

    def logits(self, model: torch.nn.Module, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """``model``'s logits ``[B, S, V]`` at this rank's positions of the right-padded full
        rows ``input_ids_BT`` (position ``t`` predicts token ``t + 1``, as :meth:`local` aligns
        the targets). Every rank of the group must call it on the same rows."""
        width = input_ids_BT.shape[1]
        span = self.span(width)
        ids_BS = self._padded(input_ids_BT, width)[:, span]
        positions_BS = torch.arange(span.start, span.stop, device=ids_BS.device).expand_as(ids_BS)
        kwargs = {GROUP_KWARG: self.group}
        return model(input_ids=ids_BS, position_ids=positions_BS, use_cache=False, **kwargs).logits

    def local(self, targets_BT: torch.Tensor) -> torch.Tensor:
        """This rank's part of per-token ``targets_BT`` (``[B, T - 1]``, aligned with the
        logits of ``T``-token rows), zero-padded: aligned with :meth:`logits`."""
        width = targets_BT.shape[1] + 1
        return self._padded(targets_BT, width)[:, self.span(width)]

    def gather(self, part_BS: torch.Tensor, targets_width: int) -> torch.Tensor:
        """Full ``[B, targets_width]`` rows from every rank's :meth:`local`-aligned part; the
        gradient flows back to this rank's part."""
        return _GatherSequence.apply(part_BS, self.group)[:, :targets_width]


def context_parallel_groups(size: int) -> SequenceShard:
    """Split the default group into context-parallel groups of ``size`` consecutive ranks;
    returns this rank's :class:`SequenceShard`. A collective: every rank calls it with the same
    ``size``."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(
            f"training.engine.context_parallel_size={size} must divide launch.num_consumers "
            f"({world})"
        )
    # every rank creates every group, in the same order
    groups = [dist.new_group(list(range(first, first + size))) for first in range(0, world, size)]
    return SequenceShard(group=groups[rank // size], rank=rank % size, size=size)
