"""Sharing a flat buffer between processes: :class:`CudaSharer` exports a CUDA tensor as an IPC
handle (``torch.multiprocessing.reductions.reduce_tensor``: the allocation's ``cudaIpcMemHandle``,
its offset, and torch's cross-process reference counter) and maps it in another process of the
same machine; :class:`LocalSharer` passes the tensor itself, for tests in one process.

A buffer is exported once, when the publisher allocates it, and mapped once per receiver (cached
by its key), then reused for every version written into it; the handoff's own acknowledgements
(weight store holds, :mod:`zbrl.transport.weight_sync.cuda_ipc`) say when it may be rewritten.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, Protocol

import torch


class Sharer(Protocol):
    """Exports buffers in the publisher, maps them in a receiver."""

    def can_share(self, device: torch.device) -> bool:
        """Whether buffers on ``device`` can be exported."""
        ...

    def share(self, buffer: torch.Tensor) -> Any:
        """A small picklable handle of ``buffer`` (which the caller keeps alive)."""
        ...

    def open(self, handle: Any, device_index: int | None) -> torch.Tensor:
        """The buffer behind ``handle`` in this process; ``device_index``: its device as this
        process numbers it."""
        ...

    def settle(self, tensors: list[torch.Tensor]) -> None:
        """Wait until this process's pending work on ``tensors`` (copies out of the buffer)
        has finished, so the publisher may rewrite it."""
        ...


class CudaSharer:
    """CUDA IPC through torch's own tensor reduction (the one ``torch.multiprocessing`` uses)."""

    def can_share(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def share(self, buffer: torch.Tensor) -> dict[str, Any]:
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(buffer)
        names = list(inspect.signature(rebuild).parameters)
        return dict(zip(names, args, strict=True))

    def open(self, handle: dict[str, Any], device_index: int | None) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        args = dict(handle)
        if device_index is not None:  # the exporter's numbering may differ from this process's
            args["storage_device"] = device_index
        return rebuild_cuda_tensor(**args)

    def settle(self, tensors: list[torch.Tensor]) -> None:
        devices = {t.device for t in tensors if t.is_cuda}
        if devices:
            devices.add(torch.device("cuda", torch.cuda.current_device()))
        for device in devices:
            torch.cuda.synchronize(device)


class LocalSharer:
    """In one process: the handle is a key into this sharer's table (tests of the protocol)."""

    def __init__(self) -> None:
        self._buffers: dict[int, torch.Tensor] = {}
        self._keys = itertools.count()
        self.opened = 0
        """How many times :meth:`open` ran (a receiver should map each buffer once)."""

    def can_share(self, device: torch.device) -> bool:
        return True

    def share(self, buffer: torch.Tensor) -> int:
        key = next(self._keys)
        self._buffers[key] = buffer
        return key

    def open(self, handle: int, device_index: int | None) -> torch.Tensor:
        self.opened += 1
        return self._buffers[handle]

    def settle(self, tensors: list[torch.Tensor]) -> None:
        return None
