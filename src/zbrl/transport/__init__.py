"""Rollout buffer, typed clients and weight sync (plain classes; ``zbrl.launch`` turns the shared
objects into actors)."""

from zbrl.transport.buffer import BufferSettings, BufferStats, RolloutBuffer
from zbrl.transport.clients import BufferClient, HubClient, WeightStoreClient
from zbrl.transport.handles import Handle, LocalHandle, RayHandle
from zbrl.transport.weight_sync import WeightPublisher, WeightReceiver

__all__ = [
    "BufferClient",
    "BufferSettings",
    "BufferStats",
    "Handle",
    "HubClient",
    "LocalHandle",
    "RayHandle",
    "RolloutBuffer",
    "WeightPublisher",
    "WeightReceiver",
    "WeightStoreClient",
]
