"""Weight sync over the Ray object store (``transport.weight_sync.type: object_store``).

Implements the protocol of :mod:`zbrl.transport.weight_sync.base`:
``ObjectStorePublisher.publish(version, named_tensors)`` on the consumer,
``ObjectStoreReceiver.poll()`` and ``ObjectStoreReceiver.receive_into(load)`` on a producer. Over
the object store: a published version is one immutable object (a CPU copy of every tensor, taken on
the training thread), put in the object store and announced to the small weight store
(:mod:`zbrl.transport.weight_sync.store`). The object store caches the latest weights for every
producer. A version is never torn: each one is
its own copy, and a newer version supersedes an older one that is still waiting to be sent.

Small versions (up to ``send_on_caller_max_bytes``, :data:`SEND_ON_CALLER_MAX_BYTES` by default:
the embedded demo's 2.2 MB, LoRA adapters) are put and announced by ``publish`` itself, on the
training thread, with the announcement sent without waiting for the store's answer; larger
ones by a background thread. A background thread's Ray calls wait for the GIL, which the training
thread of a small model holds most of the time (docs/performance.md, "The demo at staleness 1":
on the demo the announcement left 13 ms after the step instead of 20 ms). A receiver gets each
version in one round trip: its long poll (``WeightStore.wait_for_message``) returns the
announcement itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from zbrl.telemetry.spans import LOAD_WEIGHTS, MAIN_THREAD, SpanRecorder
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.handles import Pending
from zbrl.transport.weight_sync.base import BackgroundSender, NamedTensors
from zbrl.types import WeightsMessage


def cpu_copy(
    named_tensors: NamedTensors, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """A detached CPU copy of every tensor (the staging buffer of one version); with ``dtype``,
    floating-point tensors are cast to it (on their own device first, so a GPU model sends the
    smaller tensors over PCIe)."""
    return {k: _cpu_copy(v.detach(), dtype) for k, v in named_tensors.items()}


def _cpu_copy(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is None or not tensor.is_floating_point() or tensor.dtype == dtype:
        return tensor.to("cpu", copy=True)
    cast = tensor.to(dtype)  # a new tensor
    return cast if cast.device.type == "cpu" else cast.to("cpu")


def payload_bytes(named_tensors: NamedTensors) -> int:
    """Bytes of one version's tensors (what the ``publish_weights`` span's ``bytes`` says)."""
    return sum(t.numel() * t.element_size() for t in named_tensors.values())


SEND_ON_CALLER_MAX_BYTES = 16 * 2**20
"""Versions up to this many bytes are put and announced on the thread that calls ``publish``
(a few milliseconds of that thread's time for a few MB); larger ones by the background thread."""


class ObjectStorePublisher(BackgroundSender):
    """Consumer side: copy to staging on the calling thread (floating-point tensors cast to
    ``dtype``, the receivers' inference dtype, when given); a version of at most
    ``send_on_caller_max_bytes`` is sent there too, a larger one from a background thread.
    ``_pending``: ``(version, staged tensors, staged at)``."""

    what = "published"
    failure = "weight publishing"

    def __init__(
        self,
        store: WeightStoreClient,
        recorder: SpanRecorder | None = None,
        dtype: torch.dtype | None = None,
        *,
        send_on_caller_max_bytes: int = SEND_ON_CALLER_MAX_BYTES,
    ) -> None:
        """``send_on_caller_max_bytes``: 0 sends every version from the background thread."""
        super().__init__("weight-publisher", store, recorder, dtype)
        self._send_on_caller_max_bytes = send_on_caller_max_bytes
        self._announcing: Pending | None = None
        """The announcement last sent from the calling thread, until it is settled."""
        self._thread.start()

    def publish(self, version: int, named_tensors: NamedTensors) -> None:
        """Stage ``version``; send it now when it is small, else return at once and let the
        background thread send it. The receivers load it later either way."""
        self._raise_if_failed()
        staged = cpu_copy(named_tensors, self._dtype)
        staged_at = time.time()
        if payload_bytes(staged) <= self._send_on_caller_max_bytes:
            self._send_on_caller(version, staged, staged_at)
            return
        with self._cond:
            self._pending = (version, staged, staged_at)
            self._cond.notify_all()

    def _send_on_caller(
        self, version: int, staged: dict[str, torch.Tensor], staged_at: float
    ) -> None:
        """Put the tensors and send the announcement on this thread without waiting for the
        store's answer (it is settled at the next ``publish`` or ``flush``). A failure is
        raised here or there, and stays the publisher's error, as a background one would."""
        start = time.time()
        try:
            self._settle_announcement()
            payload = self._store.put_payload(staged)
            message = WeightsMessage(version, staged_at, payload)
            self._announcing = self._store.announce_without_waiting(message)
        except Exception as exc:
            raise self._failed(exc) from exc
        self._record_publish(start, version, payload_bytes(staged), thread=MAIN_THREAD)
        with self._cond:
            self._sent_version = max(self._sent_version, version)
            self._cond.notify_all()

    def _settle_announcement(self) -> None:
        """Wait for the announcement sent last from the calling thread (raising its error)."""
        pending, self._announcing = self._announcing, None
        if pending is not None:
            pending.result()

    def _failed(self, exc: Exception) -> RuntimeError:
        """Keep ``exc`` as the publisher's error; returns the error to raise."""
        self._keep_error(exc)
        return RuntimeError(f"{self.failure} failed: {exc!r}")

    def flush(self, timeout: float = 120.0) -> None:
        """Wait until the newest version has reached the store (either way it was sent)."""
        self._raise_if_failed()
        try:
            self._settle_announcement()
        except Exception as exc:
            raise self._failed(exc) from exc
        super().flush(timeout)

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                version, staged, staged_at = self._pending
            try:
                self._send(version, staged, staged_at)
            except BaseException as exc:  # surfaced on the next publish/flush
                with self._cond:
                    self._error = exc
                    self._pending = None
                    self._cond.notify_all()
                return
            with self._cond:
                if self._pending is not None and self._pending[0] == version:
                    self._pending = None
                self._sent_version = version
                self._cond.notify_all()

    def _send(self, version: int, staged: dict[str, torch.Tensor], staged_at: float) -> None:
        """The background thread's send: put, then announce and wait for the store."""
        start = time.time()
        payload = self._store.put_payload(staged)
        self._store.announce(WeightsMessage(version, staged_at, payload))
        self._record_publish(start, version, payload_bytes(staged))


class ObjectStoreReceiver:
    """Producer side: a background thread fetches newer versions; the caller swaps them in."""

    def __init__(
        self,
        store: WeightStoreClient,
        recorder: SpanRecorder | None = None,
        poll_interval_s: float = 0.5,
        *,
        initial_version: int = -1,
    ) -> None:
        """``initial_version``: the version already loaded (0 when the worker starts from the
        same checkpoint the consumer starts from)."""
        self._store = store
        self._recorder = recorder
        self._poll_interval_s = poll_interval_s
        self._cond = threading.Condition()
        self._fetched: WeightsMessage | None = None  # payload decoded to a state dict
        self._loaded_version = initial_version
        self._closed = False
        self._error: BaseException | None = None
        self.latencies_s: list[float] = []
        self._thread = threading.Thread(target=self._loop, name="weight-receiver", daemon=True)
        self._thread.start()

    @property
    def loaded_version(self) -> int:
        return self._loaded_version

    def poll(self) -> int:
        """Newest version fetched and ready to load (-1 when none)."""
        self._raise_if_failed()
        with self._cond:
            return -1 if self._fetched is None else self._fetched.version

    def wait_for(self, version: int, timeout: float | None = None) -> bool:
        """Block until a version >= ``version`` is fetched (or the receiver closes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (
                not self._closed
                and self._error is None
                and (self._fetched is None or self._fetched.version < version)
            ):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        self._raise_if_failed()
        return self._fetched is not None and self._fetched.version >= version

    def receive_into(self, load: Callable[[dict[str, torch.Tensor]], Any]) -> bool:
        """Load the newest fetched version through ``load`` if it is newer than the loaded one."""
        self._raise_if_failed()
        with self._cond:
            message = self._fetched
        if message is None or message.version <= self._loaded_version:
            return False
        start = time.time()
        load(message.payload)
        self._mark_loaded(message, start)
        return True

    def _mark_loaded(self, message: WeightsMessage, start: float) -> None:
        """``message`` is in the backend (loading began at ``start``): the loaded version, the
        publish-to-loaded latency and the ``load_weights`` span."""
        end = time.time()
        self._loaded_version = message.version
        self.latencies_s.append(end - message.published_at)
        if self._recorder is not None:
            self._recorder.record(LOAD_WEIGHTS, start, end, version=message.version)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"weight receiving failed: {self._error!r}") from self._error

    def _loop(self) -> None:
        while not self._closed:
            try:
                self._fetch_newer()
            except BaseException as exc:
                self._keep_error(exc)
                return

    def _keep_error(self, exc: BaseException) -> None:
        """Keep ``exc`` as the receiver's error (raised by the next call) and wake every
        waiter."""
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def _fetch_newer(self) -> None:
        """Long-poll the store (at most ``poll_interval_s`` per call; the announcement comes
        with the wake-up) and fetch a newer version's tensors."""
        have = -1 if self._fetched is None else self._fetched.version
        message = self._store.wait_for_message(have, self._poll_interval_s)
        if message is None or message.version <= have:
            return
        state = self._store.get_payload(message.payload)
        with self._cond:
            self._fetched = WeightsMessage(message.version, message.published_at, state)
            self._cond.notify_all()
