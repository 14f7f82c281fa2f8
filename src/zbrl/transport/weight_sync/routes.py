"""Which way weights take from the consumer to one receiver under ``transport.weight_sync:
cuda_ipc``: CUDA IPC handles when the receiver's process can map the consumer's GPU memory (same
host, the consumer's GPU visible to it), the Ray object store otherwise.

Each side describes itself as an :class:`Endpoint` (host, GPU UUIDs it sees); the publisher's goes
with every version, a receiver's is registered in the weight store when it starts. Both sides run
the same pure :func:`choose_route` on the pair, so they agree without a further message.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

CUDA_IPC = "cuda_ipc"
OBJECT_STORE = "object_store"


@dataclass(frozen=True)
class Endpoint:
    """Where one side of the handoff runs."""

    host: str
    """The machine (host name and boot id: two processes can share CUDA memory only on the same
    running kernel)."""
    gpus: tuple[str, ...]
    """UUIDs of the CUDA devices this process sees, in its own device order (index i is
    ``cuda:i`` here); empty without CUDA."""
    gpu: str | None = None
    """The publisher's: the UUID of the device its weights are on (None: not on CUDA)."""
    pid: int = 0
    """The process id (the publisher checks whether a receiver holding a buffer still lives)."""


@dataclass(frozen=True)
class Route:
    """How one receiver gets the weights, and why (the log line)."""

    kind: Literal["cuda_ipc", "object_store"]
    reason: str
    device_index: int | None = None
    """For ``cuda_ipc``: the consumer's GPU as the receiver's process numbers it."""


def host_key() -> str:
    """This machine: host name and the kernel's boot id (when Linux has one)."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    boot_id = boot.read_text().strip() if boot.exists() else ""
    return f"{socket.gethostname()}/{boot_id}"


def visible_gpus() -> tuple[str, ...]:
    """UUIDs of the CUDA devices this process sees (empty without CUDA)."""
    if not torch.cuda.is_available():
        return ()
    return tuple(
        _uuid_text(torch.cuda.get_device_properties(i).uuid)
        for i in range(torch.cuda.device_count())
    )


def _uuid_text(uuid: object) -> str:
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def local_endpoint(device: torch.device | None = None) -> Endpoint:
    """This process as an endpoint; ``device``: where the publisher's weights are."""
    gpus = visible_gpus()
    gpu = None
    if device is not None and device.type == "cuda" and gpus:
        index = device.index if device.index is not None else torch.cuda.current_device()
        gpu = gpus[index]
    return Endpoint(host_key(), gpus, gpu, os.getpid())


def choose_route(source: Endpoint, sink: Endpoint, member: str) -> Route:
    """The route from the publisher at ``source`` to the receiver ``member`` at ``sink``."""
    if source.gpu is None:
        return Route(OBJECT_STORE, "the consumer's weights are not on a CUDA device")
    if source.host != sink.host:
        return Route(
            OBJECT_STORE,
            f"{member} runs on another machine ({_host_name(sink.host)}, the consumer on "
            f"{_host_name(source.host)}); CUDA IPC works within one machine",
        )
    if source.pid == sink.pid:
        return Route(
            OBJECT_STORE,
            f"{member} runs in the consumer's own process (CUDA IPC is between processes)",
        )
    if not sink.gpus:
        return Route(
            OBJECT_STORE,
            f"{member}'s process sees no CUDA device (give it a GPU share, e.g. "
            "launch.producer_num_gpus=0.5 with launch.consumer_num_gpus=0.5 on one GPU)",
        )
    if source.gpu not in sink.gpus:
        return Route(
            OBJECT_STORE,
            f"the consumer's GPU {source.gpu} is not visible in {member}'s process (it sees "
            f"{', '.join(sink.gpus)}); place both on one GPU with fractional "
            "launch.producer_num_gpus / launch.consumer_num_gpus",
        )
    index = sink.gpus.index(source.gpu)
    where = "the same GPU" if sink.gpus == (source.gpu,) else f"the same machine (cuda:{index})"
    return Route(CUDA_IPC, f"{member} shares {where} with the consumer", index)


def _host_name(key: str) -> str:
    return key.split("/", 1)[0]
