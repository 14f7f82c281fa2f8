"""Weight sync: the protocol (:mod:`.base`), its implementations (:mod:`.object_store`) and the
factory that picks one from the config (:mod:`.factory`)."""

from zbrl.transport.weight_sync.base import NamedTensors, WeightPublisher, WeightReceiver

__all__ = ["NamedTensors", "WeightPublisher", "WeightReceiver"]
