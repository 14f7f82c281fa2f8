"""Training engines: the interface (:mod:`.base`) and its implementations: one process
(:mod:`.single`), data parallel (:mod:`.ddp`) and fully sharded (:mod:`.fsdp2`). The last two
import ``torch.distributed`` and are imported where they are built."""

from zbrl.training.engine.base import Engine
from zbrl.training.engine.single import SingleProcessEngine

__all__ = ["Engine", "SingleProcessEngine"]
