"""Training engines: the interface (:mod:`.base`) and its implementations (:mod:`.single`; DDP and
FSDP2 engines come next)."""

from zbrl.training.engine.base import Engine
from zbrl.training.engine.single import SingleProcessEngine

__all__ = ["Engine", "SingleProcessEngine"]
