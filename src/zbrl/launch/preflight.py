"""Checks that need the network or the machine, run before anything starts (no run dir, no Ray,
no worker): each failure is a RunError that names the field and the fix.

The config's own checks (zbrl.config.checks) cannot do these: whether ``launch.ray_address``
answers, whether the broadcast address exists here, whether this machine has the GPUs NCCL needs.
"""

from __future__ import annotations

import os
import socket

from zbrl.assembly.model_source import check_model_source
from zbrl.assembly.settings import weight_sync_backend
from zbrl.config import RunConfig
from zbrl.config.transport import BroadcastSync
from zbrl.errors import RunError
from zbrl.transport.weight_sync.broadcast import check_bindable

CONNECT_TIMEOUT_S = 5.0


def preflight(cfg: RunConfig) -> None:
    check_ray_address(cfg)
    check_broadcast_address(cfg)
    check_nccl_gpus(cfg)
    check_model_source(cfg)  # model, tokenizer, chat template (a Hub id/GGUF is fetched here)


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of ``HOST:PORT`` or ``ray://HOST:PORT``; None for ``auto`` and the like."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray_address(cfg: RunConfig) -> None:
    field, address = "launch.ray_address", cfg.launch.ray_address
    if address is None and os.environ.get("RAY_ADDRESS"):
        field, address = "RAY_ADDRESS (environment)", os.environ["RAY_ADDRESS"]
    if not address or address == "auto":
        return
    target = split_address(address)
    if target is None:
        raise RunError(
            f"{field}={address!r} is not HOST:PORT; give the address `ray start --head` printed "
            "(for example 10.0.0.1:6379), or unset it for a local run"
        )
    try:
        with socket.create_connection(target, timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise RunError(
            f"{field}={address!r} does not answer ({exc}); start the cluster's head there "
            f"(`ray start --head --node-ip-address={target[0]} --port={target[1]}`, see "
            "docs/scaling.md) or fix the address; unset it for a local run"
        ) from None


def check_broadcast_address(cfg: RunConfig) -> None:
    sync = cfg.transport.weight_sync
    if not isinstance(sync, BroadcastSync) or sync.address is None:
        return
    try:
        infos = socket.getaddrinfo(sync.address, None, socket.AF_INET)
    except OSError as exc:
        raise RunError(
            f"transport.weight_sync.address={sync.address!r} does not resolve ({exc}); give "
            "the IP address of the consumers' node, or unset it to use the node's Ray address"
        ) from None
    if cfg.launch.ray_address is None:  # a local run: the address must be one of this machine's
        try:
            check_bindable(infos[0][4][0])
        except ValueError as exc:
            raise RunError(f"{exc} (a local run uses 127.0.0.1)") from None


def check_nccl_gpus(cfg: RunConfig) -> None:
    if weight_sync_backend(cfg) != "nccl" or cfg.launch.ray_address is not None:
        return  # on a cluster the placement groups ask for the GPUs and fail if there are none
    import torch

    if not torch.cuda.is_available():
        raise RunError(
            "transport.weight_sync.backend resolves to nccl but this machine has no CUDA GPU "
            "(torch.cuda.is_available() is False); set transport.weight_sync.backend=gloo and "
            "launch.*_num_gpus=0, or run on a GPU machine or cluster"
        )
