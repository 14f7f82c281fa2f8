"""The rollout buffer as a run's actor: :class:`zbrl.transport.buffer.RolloutBuffer`, whose
process also imports torch in the background from its start.

The buffer's own code needs no torch, and neither does the driver that creates it
(docs/performance.md, Start-up); but the rollout groups it holds carry tensors, so the first
push unpickles them with torch. Imported in the background while the workers load their
models, torch is ready before the first group arrives, instead of being imported (a second or
more of CPU) between the first generation and the first training step."""

from __future__ import annotations

import importlib
import threading

from zbrl.transport.buffer import BufferSettings, RolloutBuffer


class RolloutBufferActor(RolloutBuffer):
    """:class:`RolloutBuffer`, with torch imported in the background from construction on."""

    def __init__(self, settings: BufferSettings) -> None:
        super().__init__(settings)
        self.torch_import = threading.Thread(
            target=importlib.import_module, args=("torch",), name="torch-import", daemon=True
        )
        self.torch_import.start()
