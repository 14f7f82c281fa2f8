"""Weight sync: the protocol (:mod:`.base`), its implementations (:mod:`.object_store`) and the
factory that picks one from the config (:mod:`.factory`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zbrl.transport.weight_sync.base import NamedTensors, WeightPublisher, WeightReceiver

__all__ = ["NamedTensors", "WeightPublisher", "WeightReceiver"]


def __getattr__(name: str) -> Any:
    """The protocol's names, imported on first use: the weight store's process (which imports
    :mod:`.store`, inside this package) starts without importing torch."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from zbrl.transport.weight_sync import base

    return getattr(base, name)
