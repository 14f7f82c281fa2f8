"""The settings of the shared actors and of the placement, from a RunConfig: the part of
:mod:`zbrl.assembly.settings` the driver needs before any worker starts. It imports no torch
(the rollout buffer's settings and class, the weight-sync backend), so that the driver creates
the rollout buffer while Ray starts without importing torch (docs/performance.md, Start-up);
a test keeps it so."""

from __future__ import annotations

from zbrl.config import RunConfig
from zbrl.config.transport import BroadcastSync
from zbrl.transport.buffer import BufferSettings


def buffer_settings(cfg: RunConfig) -> BufferSettings:
    a = cfg.algorithm
    return BufferSettings(
        groups_per_step=cfg.training.train_batch_size,
        max_staleness=cfg.transport.max_staleness,
        num_producers=cfg.launch.num_producers,
        filter_range=a.filter_range if a.dynamic_batching else None,
        dynamic_batching=a.dynamic_batching,
        drop_all_truncated_groups=a.filter_truncated_response,
        capacity=cfg.transport.buffer_capacity,
    )


def weight_sync_backend(cfg: RunConfig) -> str:
    """The collective backend of broadcast weight sync (``auto``: nccl when consumers have
    GPUs, gloo otherwise); ``none`` for the object store."""
    sync = cfg.transport.weight_sync
    if not isinstance(sync, BroadcastSync):
        return "none"
    if sync.backend != "auto":
        return sync.backend
    return "nccl" if cfg.launch.consumer_num_gpus > 0 else "gloo"
