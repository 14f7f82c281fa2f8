"""Choose the weight-sync implementation from ``transport.weight_sync`` (the config's
discriminated union on ``type``)."""

from __future__ import annotations

from zbrl.config.transport import WeightSyncConfig
from zbrl.telemetry.spans import SpanRecorder
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.weight_sync.base import WeightPublisher, WeightReceiver
from zbrl.transport.weight_sync.object_store import ObjectStorePublisher, ObjectStoreReceiver


def build_publisher(
    sync: WeightSyncConfig, store: WeightStoreClient, recorder: SpanRecorder | None = None
) -> WeightPublisher:
    """The consumer's publisher. ``store`` is the run's weight store (object-store sync)."""
    if sync.type == "object_store":
        return ObjectStorePublisher(store, recorder)
    raise ValueError(f"transport.weight_sync.type={sync.type!r} has no implementation")


def build_receiver(
    sync: WeightSyncConfig,
    store: WeightStoreClient,
    recorder: SpanRecorder | None = None,
    *,
    initial_version: int,
) -> WeightReceiver:
    """A producer's or the evaluator's receiver; ``initial_version`` is the version its backend
    already holds (0 when it starts from the checkpoint the consumer starts from)."""
    if sync.type == "object_store":
        return ObjectStoreReceiver(store, recorder, initial_version=initial_version)
    raise ValueError(f"transport.weight_sync.type={sync.type!r} has no implementation")
