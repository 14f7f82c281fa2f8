"""Rollout buffer, typed clients and weight sync (plain classes; ``zbrl.launch`` turns the shared
objects into actors)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zbrl.lazy import lazy_attributes

if TYPE_CHECKING:
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

_HOMES = {
    "BufferClient": "clients",
    "BufferSettings": "buffer",
    "BufferStats": "buffer",
    "Handle": "handles",
    "HubClient": "clients",
    "LocalHandle": "handles",
    "RayHandle": "handles",
    "RolloutBuffer": "buffer",
    "WeightPublisher": "weight_sync",
    "WeightReceiver": "weight_sync",
    "WeightStoreClient": "clients",
}
"""Where each name lives, imported on first use: a process that needs one light module (the
telemetry hub's, the weight store's) does not import the rollout buffer and torch with it."""


__getattr__ = lazy_attributes(__name__, _HOMES)
