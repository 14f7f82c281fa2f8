"""The weight-sync protocol: how trained weights reach the producers and evaluator
(docs/architecture.md, Weight sync).

The protocol has two sides. The consumer holds a :class:`WeightPublisher` and calls
``publish(version, named_tensors)`` after every step; producers and the evaluator hold a
:class:`WeightReceiver` that fetches newer versions in the background (``poll`` says which one is
ready) and swaps one in with ``receive_into(load_fn)`` when the caller chooses (between generation
batches). Roles depend only on these protocols; :mod:`~zbrl.transport.weight_sync.factory` picks
the implementation from ``transport.weight_sync``. Implementations: the Ray object store
(:mod:`~zbrl.transport.weight_sync.object_store`, the default) and a torch.distributed broadcast
group (:mod:`~zbrl.transport.weight_sync.broadcast`).

Guarantees every implementation keeps: versions only go up (a publish older than the newest one
may be dropped); a version is never torn (a receiver loads exactly the tensors one ``publish`` was
given, even while training goes on); ``publish`` does not wait for the transfer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from zbrl.telemetry.spans import PUBLISH_WEIGHTS, SpanRecorder

NamedTensors = Mapping[str, torch.Tensor]
"""Tensors by their name in the trained model's ``state_dict``."""


class WeightPublisher(Protocol):
    """Consumer side of weight sync."""

    def publish(self, version: int, named_tensors: NamedTensors) -> None:
        """Make ``named_tensors`` version ``version``; returns before the transfer finishes (the
        tensors are copied first, so the caller may change them at once). Raises a
        RuntimeError naming the cause if an earlier background transfer failed."""
        ...

    def flush(self, timeout: float = 120.0) -> None:
        """Block until the newest published version has reached the receivers' side; raises
        TimeoutError after ``timeout`` seconds."""
        ...

    def close(self) -> None:
        """Stop the background sender; unsent versions are dropped (``flush`` first)."""
        ...


class WeightReceiver(Protocol):
    """Producer / evaluator side of weight sync."""

    @property
    def loaded_version(self) -> int:
        """The version last loaded through :meth:`receive_into` (or the initial version)."""
        ...

    @property
    def latencies_s(self) -> list[float]:
        """Seconds from publish to loaded, one per version loaded."""
        ...

    def poll(self) -> int:
        """Newest version fetched and ready to load (-1 when none); does not block."""
        ...

    def wait_for(self, version: int, timeout: float | None = None) -> bool:
        """Block until a version >= ``version`` is ready to load; False on timeout or close."""
        ...

    def receive_into(self, load: Callable[[dict[str, torch.Tensor]], Any]) -> bool:
        """Load the newest ready version through ``load`` if it is newer than the loaded one (on
        the calling thread); True when something was loaded. ``load`` must copy what it keeps:
        the tensors it is given may be reused once it returns."""
        ...

    def close(self) -> None:
        """Stop fetching and wake every waiter."""
        ...


class BackgroundSender:
    """The part of a publisher that the object-store and broadcast transports share: a staged
    version waits in ``_pending`` (guarded by ``_cond``) until the sender thread (``_send_loop``,
    written by the subclass) takes it; :meth:`flush`, :meth:`close` and the error report."""

    what = "sent"
    """The verb in the timeout message ("weights not {what} within ...")."""
    failure = "weight sending"
    """What failed, in the error message ("{failure} failed: ...")."""

    def __init__(
        self,
        thread_name: str,
        store: Any,
        recorder: SpanRecorder | None,
        dtype: torch.dtype | None,
    ) -> None:
        """``store``: the transport's weight store client; ``recorder``: where the
        ``publish_weights`` spans go (None: nowhere); ``dtype``: the receivers' inference dtype,
        that floating-point tensors are cast to as they are staged (None: sent as given)."""
        self._store = store
        self._recorder = recorder
        self._dtype = dtype
        self._cond = threading.Condition()
        self._pending: Any = None
        self._sent_version = -1
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._send_loop, name=thread_name, daemon=True)

    def _send_loop(self) -> None:
        raise NotImplementedError

    def _record_publish(
        self, start: float, version: int, nbytes: int, thread: str = "weights", **extra: Any
    ) -> None:
        """The ``publish_weights`` span of ``version`` (``nbytes`` sent), from ``start`` to
        now."""
        if self._recorder is not None:
            self._recorder.record(
                PUBLISH_WEIGHTS,
                start,
                time.time(),
                thread=thread,
                version=version,
                bytes=nbytes,
                **extra,
            )

    def flush(self, timeout: float = 120.0) -> None:
        """Wait until the newest staged version has been sent."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending is not None and self._error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"weights not {self.what} within {timeout}s")
                self._cond.wait(remaining)
        self._raise_if_failed()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    @property
    def sent_version(self) -> int:
        return self._sent_version

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"{self.failure} failed: {self._error!r}") from self._error

    def _keep_error(self, exc: BaseException) -> None:
        """Keep ``exc`` as the sender's error (raised by the next publish or flush) and wake
        every waiter."""
        with self._cond:
            self._error = exc
            self._cond.notify_all()
