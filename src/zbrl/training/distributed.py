"""The consumers' torch.distributed process group: where it meets, how it is joined, and the few
small collectives the train step needs besides gradient reduction.

A run's driver hosts the rendezvous store (:class:`GroupHost`, a ``TCPStore`` on the head node's
address, on a port the OS picks, so no port can be taken between choosing and binding it); each
consumer joins with its rank (:func:`join_group`). gloo carries the group on CPU, NCCL when the
consumers have GPUs (:func:`resolve_backend`). Nothing here imports Ray.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist

GROUP_TIMEOUT_S = 600.0
"""How long a collective (and the rendezvous) waits for the slowest rank before failing. A rank
that dies mid-step is reported by the driver long before this; the bound only stops a stuck group
from waiting forever."""


@dataclass(frozen=True)
class GroupSpec:
    """Everything a consumer needs to join the group (picklable; passed to each consumer)."""

    host: str
    """Address of the rendezvous store (the head node's; 127.0.0.1 in local runs)."""
    port: int
    world_size: int
    backend: Literal["gloo", "nccl"]
    timeout_s: float


def resolve_backend(requested: str, consumer_gpus: float) -> Literal["gloo", "nccl"]:
    """``auto`` is NCCL when the consumers have GPUs, gloo otherwise."""
    if requested == "auto":
        return "nccl" if consumer_gpus > 0 else "gloo"
    if requested not in ("gloo", "nccl"):
        raise ValueError(f"unknown collective backend {requested!r}; use auto, gloo or nccl")
    return requested  # type: ignore[return-value]


class GroupHost:
    """The rendezvous store of one group, hosted by the process that creates it (the driver).
    Keep it alive until every rank has joined (the driver keeps it for the whole run)."""

    def __init__(self, host: str, timeout_s: float = GROUP_TIMEOUT_S) -> None:
        self.host = host
        self.timeout_s = timeout_s
        self._store = dist.TCPStore(
            host,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=timeout_s),
        )

    @property
    def port(self) -> int:
        return int(self._store.port)

    def spec(self, world_size: int, backend: Literal["gloo", "nccl"]) -> GroupSpec:
        return GroupSpec(self.host, self.port, world_size, backend, self.timeout_s)


def join_group(spec: GroupSpec, rank: int) -> None:
    """Join the group as ``rank`` (blocks until all ``world_size`` ranks have joined). With NCCL
    the process's GPU is its first visible device (Ray gives each consumer its own)."""
    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank {rank} is outside the group of {spec.world_size}")
    timeout = timedelta(seconds=spec.timeout_s)
    store = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=timeout)
    if spec.backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(
        spec.backend, store=store, rank=rank, world_size=spec.world_size, timeout=timeout
    )


def leave_group() -> None:
    """Destroy this process's default group (no-op when it has none).

    Objects that hold the group (a DDP wrapper, an FSDP2 mesh) can sit in reference cycles that
    outlive ``destroy_process_group``; the group would then be torn down during interpreter exit,
    where gloo aborts the process ("terminate called without an active exception"), so those
    cycles are collected first."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def all_reduce_floats(
    values: list[float], op: Literal["sum", "max"], device: torch.device
) -> list[float]:
    """``values`` reduced element-wise over the group (float64, one collective)."""
    if not values:
        return []
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()
