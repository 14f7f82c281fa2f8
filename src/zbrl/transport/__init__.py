"""Rollout buffer and weight sync (plain classes; ``zbrl.launch`` turns them into actors)."""

from zbrl.transport.buffer import BufferSettings, BufferStats, RolloutBuffer
from zbrl.transport.handles import Handle, LocalHandle, RayHandle
from zbrl.transport.weights import WeightPublisher, WeightReceiver, WeightStore, cpu_copy

__all__ = [
    "BufferSettings",
    "BufferStats",
    "Handle",
    "LocalHandle",
    "RayHandle",
    "RolloutBuffer",
    "WeightPublisher",
    "WeightReceiver",
    "WeightStore",
    "cpu_copy",
]
