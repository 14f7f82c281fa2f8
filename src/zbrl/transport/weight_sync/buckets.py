"""Flattening a state dict into one byte buffer sent in buckets, and back.

A :class:`Layout` places every tensor at an aligned byte offset of one flat ``uint8`` buffer; the
buffer is cut into buckets of ``bucket_bytes`` (the last one shorter). Sender and receivers agree on
the layout before any bytes move, so a receiver allocates the whole buffer once, receives every
bucket into its slice, and then reads each tensor as a view of the buffer (no second copy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

ALIGN = 64
"""Byte alignment of every tensor in the flat buffer (any dtype can be viewed at such offsets)."""


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    slots: tuple[TensorSlot, ...]
    total_bytes: int
    bucket_bytes: int

    def buckets(self) -> list[tuple[int, int]]:
        """(start, end) byte ranges of the buckets, in sending order."""
        return [
            (start, min(start + self.bucket_bytes, self.total_bytes))
            for start in range(0, self.total_bytes, self.bucket_bytes)
        ]

    def signature(self) -> tuple:
        """What must match for two versions to share a layout (names, dtypes, shapes)."""
        return tuple((s.name, s.dtype, s.shape) for s in self.slots)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_layout(
    named_tensors: Mapping[str, torch.Tensor], bucket_bytes: int, dtype: torch.dtype | None = None
) -> Layout:
    """The layout of ``named_tensors`` (in their order) with buckets of ``bucket_bytes``; with
    ``dtype``, floating-point tensors get slots of that dtype (:func:`flatten_into` casts them
    as it copies: the receivers' inference dtype, so fewer bytes go over the wire)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    slots, offset = [], 0
    for name, tensor in named_tensors.items():
        slot_dtype = tensor.dtype
        if dtype is not None and tensor.is_floating_point():
            slot_dtype = dtype
        nbytes = tensor.numel() * slot_dtype.itemsize
        slots.append(TensorSlot(name, _dtype_name(slot_dtype), tuple(tensor.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return Layout(tuple(slots), offset, bucket_bytes)


def _view(flat: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    raw = flat[slot.offset : slot.offset + slot.nbytes]
    return raw.view(getattr(torch, slot.dtype)).view(slot.shape)


def flatten_into(
    named_tensors: Mapping[str, torch.Tensor], layout: Layout, flat: torch.Tensor
) -> torch.Tensor:
    """Copy every tensor into its slot of ``flat`` (uint8, ``layout.total_bytes`` long), cast to
    the slot's dtype."""
    for slot in layout.slots:
        _view(flat, slot).copy_(named_tensors[slot.name].detach())
    return flat


def flatten(named_tensors: Mapping[str, torch.Tensor], layout: Layout) -> torch.Tensor:
    """A new CPU flat buffer holding ``named_tensors`` (the staging copy of one version)."""
    flat = torch.empty(layout.total_bytes, dtype=torch.uint8)
    return flatten_into(named_tensors, layout, flat)


def unflatten(flat: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """Every tensor of ``layout`` as a view of ``flat``."""
    return {slot.name: _view(flat, slot) for slot in layout.slots}


def plan_buckets(
    named_tensors: Mapping[str, torch.Tensor], bucket_bytes: int, dtype: torch.dtype | None = None
) -> list[Layout]:
    """Split ``named_tensors`` (in their order) into groups of whole tensors of at most
    ``bucket_bytes`` each (a tensor larger than that is a group of its own), one
    :class:`Layout` per group: each group is a separate flat buffer (the CUDA handoff shares one
    handle per buffer), so no tensor straddles two of them. ``dtype`` as in :func:`plan_layout`."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    groups: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in named_tensors.items():
        slot_dtype = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        nbytes = -(-tensor.numel() * slot_dtype.itemsize // ALIGN) * ALIGN
        if groups[-1] and used + nbytes > bucket_bytes:
            groups.append({})
            used = 0
        groups[-1][name] = tensor
        used += nbytes
    layouts = []
    for group in groups:
        if group:
            layout = plan_layout(group, bucket_bytes, dtype)
            layouts.append(Layout(layout.slots, layout.total_bytes, max(1, layout.total_bytes)))
    return layouts
