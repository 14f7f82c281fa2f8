"""Weight sync: the protocol (:mod:`.base`), its implementations (:mod:`.object_store`) and the
factory that picks one from the config (:mod:`.factory`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zbrl.lazy import lazy_attributes

if TYPE_CHECKING:
    from zbrl.transport.weight_sync.base import NamedTensors, WeightPublisher, WeightReceiver

__all__ = ["NamedTensors", "WeightPublisher", "WeightReceiver"]


__getattr__ = lazy_attributes(__name__, dict.fromkeys(__all__, "base"))
"""The protocol's names, imported on first use: the weight store's process (which imports
:mod:`.store`, inside this package) starts without importing torch."""
