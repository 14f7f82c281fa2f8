"""Choose the weight-sync implementation from ``transport.weight_sync`` (the config's
discriminated union on ``type``)."""

from __future__ import annotations

import torch

from zbrl.config.transport import CudaIpcSync, WeightSyncConfig
from zbrl.telemetry.spans import SpanRecorder
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.weight_sync.base import WeightPublisher, WeightReceiver
from zbrl.transport.weight_sync.broadcast import (
    BroadcastPublisher,
    BroadcastReceiver,
    BroadcastSettings,
)
from zbrl.transport.weight_sync.cuda_ipc import CudaIpcPublisher, CudaIpcReceiver
from zbrl.transport.weight_sync.object_store import ObjectStorePublisher, ObjectStoreReceiver


def build_publisher(
    sync: WeightSyncConfig,
    store: WeightStoreClient,
    recorder: SpanRecorder | None = None,
    *,
    broadcast: BroadcastSettings | None = None,
    dtype: torch.dtype | None = None,
) -> WeightPublisher:
    """The consumer's publisher. ``store`` is the run's weight store (it also coordinates the
    broadcast group); ``broadcast`` is required for ``type: broadcast``; ``dtype`` is the
    receivers' inference dtype, to which floating-point weights are cast before they are sent
    (None: as given)."""
    if sync.type == "object_store":
        return ObjectStorePublisher(store, recorder, dtype)
    if sync.type == "broadcast":
        return BroadcastPublisher(store, _need(broadcast), recorder, dtype)
    if isinstance(sync, CudaIpcSync):
        return CudaIpcPublisher(
            store,
            recorder,
            dtype,
            bucket_bytes=max(1, int(sync.bucket_mb * 2**20)),
            buffers=sync.buffers,
            release_timeout_s=sync.release_timeout_s,
        )
    raise ValueError(f"transport.weight_sync.type={sync.type!r} has no implementation")


def build_receiver(
    sync: WeightSyncConfig,
    store: WeightStoreClient,
    recorder: SpanRecorder | None = None,
    *,
    initial_version: int,
    member: str,
    broadcast: BroadcastSettings | None = None,
) -> WeightReceiver:
    """A producer's or the evaluator's receiver; ``initial_version`` is the version its backend
    already holds (0 when it starts from the checkpoint the consumer starts from); ``member``
    names it in the broadcast group and among the CUDA handoff's receivers (e.g.
    ``producer-1``)."""
    if sync.type == "object_store":
        return ObjectStoreReceiver(store, recorder, initial_version=initial_version)
    if sync.type == "broadcast":
        return BroadcastReceiver(
            store, _need(broadcast), member, recorder, initial_version=initial_version
        )
    if sync.type == "cuda_ipc":
        return CudaIpcReceiver(store, member, recorder, initial_version=initial_version)
    raise ValueError(f"transport.weight_sync.type={sync.type!r} has no implementation")


def _need(settings: BroadcastSettings | None) -> BroadcastSettings:
    if settings is None:
        raise ValueError("transport.weight_sync.type=broadcast needs its BroadcastSettings")
    return settings
