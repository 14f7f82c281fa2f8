"""Typed clients of the shared objects: the rollout buffer, the weight store and the telemetry hub.

Each client wraps a :class:`~zbrl.transport.handles.Handle` (``LocalHandle`` in one process,
``RayHandle`` for an actor) and is the one place that names its target's methods, as functions
of the target class (``RolloutBuffer.take``) rather than name strings: roles call
``buffer.take(n, timeout)``, and a misspelt method is an AttributeError (and a type-checker
error) instead of a runtime Ray error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from zbrl.telemetry.hub import TelemetryHub
from zbrl.transport.buffer import RolloutBuffer, TakeResult
from zbrl.transport.handles import Handle, Pending
from zbrl.transport.weight_sync.store import WeightStore
from zbrl.types import Reservation, RolloutGroup, WeightsMessage


class BufferClient:
    """The :class:`~zbrl.transport.buffer.RolloutBuffer` as producers, consumers and the driver
    see it (see its methods for the contracts)."""

    def __init__(self, handle: Handle, node: str = "") -> None:
        """``node``: where the caller runs (the buffer tells a consumer which producers on its
        node are parked)."""
        self.handle = handle
        self.node = node
        self._advancing: Pending | None = None
        self._putting: Pending | None = None

    # producers
    def reserve(self, producer: int, n: int, timeout: float | None) -> Reservation | None:
        """Sent while the previous :meth:`put` may still be on its way (the buffer's admission
        does not depend on it); that put is settled when the reservation is back."""
        reservation = self.handle.call(RolloutBuffer.reserve, producer, n, timeout, self.node)
        self._settle_put()
        return reservation

    def put(self, groups: list[RolloutGroup], producer_state: dict[str, Any] | None = None) -> None:
        """Sent without waiting (the producer generates on while the groups travel); an error
        it raised comes out of the next producer call."""
        self._settle_put()
        self._putting = self.handle.send(RolloutBuffer.put, groups, producer_state)

    def release(self, tickets: list[int]) -> None:
        self._settle_put()
        self.handle.call(RolloutBuffer.release, tickets)

    def producer_finished(self, producer: int) -> None:
        """After every put of this producer has landed."""
        self._settle_put()
        self.handle.call(RolloutBuffer.producer_finished, producer)

    def _settle_put(self) -> None:
        pending, self._putting = self._putting, None
        if pending is not None:
            pending.result()

    # consumers
    def take(
        self, n: int | None, timeout: float | None, step: int = 0, rank: int = 0, ranks: int = 1
    ) -> TakeResult:
        """``ranks > 1``: data-parallel consumer ``rank`` takes the batch of ``step``."""
        self._settle_advance()
        return self.handle.call(RolloutBuffer.take, n, timeout, step, rank, ranks, self.node)

    def advance_version(self, version: int) -> None:
        """Sent without waiting (one round trip less per step); an error it raised comes out of
        the next ``take`` or ``advance_version``."""
        self._settle_advance()
        self._advancing = self.handle.send(RolloutBuffer.advance_version, version)

    def _settle_advance(self) -> None:
        pending, self._advancing = self._advancing, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        self.handle.call(RolloutBuffer.close)

    def state(self) -> dict[str, Any]:
        return self.handle.call(RolloutBuffer.state)

    # the driver
    def request_stop(self) -> None:
        self.handle.call(RolloutBuffer.request_stop)

    def reclaim(self, producer: int | None = None) -> dict[int, dict[str, Any] | None]:
        return self.handle.call(RolloutBuffer.reclaim, producer)

    def load_state(self, state: dict[str, Any]) -> None:
        self.handle.call(RolloutBuffer.load_state, state)

    # anyone
    def snapshot(self) -> dict[str, float]:
        return self.handle.call(RolloutBuffer.snapshot)

    def failure_log(self) -> dict[str, Any]:
        return self.handle.call(RolloutBuffer.failure_log)


class WeightStoreClient:
    """The :class:`~zbrl.transport.weight_sync.object_store.WeightStore` and the object store its
    announcements point into."""

    def __init__(self, handle: Handle) -> None:
        self.handle = handle

    def announce(self, message: WeightsMessage) -> bool:
        """Make ``message`` the latest version (False when it is not newer)."""
        return self.handle.call(WeightStore.put, message)

    def announce_without_waiting(self, message: WeightsMessage) -> Pending:
        """:meth:`announce`, sent without waiting: the result (or error) comes from the
        returned call's ``result()``."""
        return self.handle.send(WeightStore.put, message)

    def wait_for_newer(self, have: int, timeout: float) -> int:
        return self.handle.call(WeightStore.wait_for_newer, have, timeout)

    def wait_for_message(self, have: int, timeout: float) -> WeightsMessage | None:
        """The latest announcement once it is newer than ``have`` (None after ``timeout``)."""
        return self.handle.call(WeightStore.wait_for_message, have, timeout, timeout=timeout + 60)

    def latest(self) -> WeightsMessage | None:
        return self.handle.call(WeightStore.latest)

    def latest_version(self) -> int:
        return self.handle.call(WeightStore.latest_version)

    # receivers and holds of the CUDA handoff
    def register_receiver(self, member: str, endpoint: Any, keep_holds: bool = False) -> None:
        self.handle.call(WeightStore.register_receiver, member, endpoint, keep_holds)

    def unregister_receiver(self, member: str) -> None:
        self.handle.call(WeightStore.unregister_receiver, member)

    def receivers(self) -> dict[str, Any]:
        return self.handle.call(WeightStore.receivers)

    def acquire_newer(self, member: str, have: int, timeout: float) -> WeightsMessage | None:
        return self.handle.call(
            WeightStore.acquire_newer, member, have, timeout, timeout=timeout + 60
        )

    def release(self, member: str, version: int) -> None:
        self.handle.call(WeightStore.release, member, version)

    def holders(self) -> dict[int, list[str]]:
        return self.handle.call(WeightStore.holders)

    def drop_holds(self, member: str) -> None:
        self.handle.call(WeightStore.drop_holds, member)

    # broadcast group membership
    def request_join(self, member: str) -> int:
        return self.handle.call(WeightStore.request_join, member)

    def leave(self, member: str) -> None:
        self.handle.call(WeightStore.leave, member)

    def drop_member(self, member: str, seq: int) -> None:
        self.handle.call(WeightStore.drop_member, member, seq)

    def join_requests(self) -> dict[str, int]:
        return self.handle.call(WeightStore.join_requests)

    def set_group(self, group: Any) -> None:
        self.handle.call(WeightStore.set_group, group)

    def wait_for_group(self, have_epoch: int, timeout: float) -> Any:
        return self.handle.call(WeightStore.wait_for_group, have_epoch, timeout)

    def kv_set(self, key: str, value: bytes) -> None:
        self.handle.call(WeightStore.kv_set, key, value)

    def kv_get(self, key: str, timeout: float) -> bytes | None:
        return self.handle.call(WeightStore.kv_get, key, timeout, timeout=timeout + 60)

    def kv_add(self, key: str, amount: int) -> int:
        return self.handle.call(WeightStore.kv_add, key, amount)

    def kv_check(self, keys: list[str]) -> bool:
        return self.handle.call(WeightStore.kv_check, keys)

    def kv_delete(self, key: str) -> bool:
        return self.handle.call(WeightStore.kv_delete, key)

    def kv_clear(self, prefix: str) -> None:
        self.handle.call(WeightStore.kv_clear, prefix)

    def put_payload(self, value: Any) -> Any:
        """Store ``value`` (a state dict) in the object store; returns what to announce."""
        return self.handle.put_object(value)

    def get_payload(self, payload: Any, timeout: float | None = None) -> Any:
        return self.handle.get_object(payload, timeout)


class HubClient:
    """The :class:`~zbrl.telemetry.hub.TelemetryHub` (workers send, the driver drains)."""

    def __init__(self, handle: Handle) -> None:
        self.handle = handle
        self._sending: Pending | None = None
        self._lock = threading.Lock()  # a worker's span flusher thread calls too

    def add_spans(self, spans: list[dict[str, Any]]) -> None:
        """Waits for the hub, and for what was sent before it (a role's final flush)."""
        self._settle()
        self.handle.call(TelemetryHub.add_spans, spans)

    def add_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Sent without waiting (a consumer calls it every step); an error it raised comes out
        of the next ``add_metrics`` or ``add_event``."""
        self._settle(then=lambda: self.handle.send(TelemetryHub.add_metrics, step, metrics))

    def add_event(self, kind: str, data: Any) -> None:
        """Sent without waiting, like :meth:`add_metrics`."""
        self._settle(then=lambda: self.handle.send(TelemetryHub.add_event, kind, data))

    def _settle(self, then: Callable[[], Pending] | None = None) -> None:
        """Wait for the call in flight (raising its error), then start ``then``."""
        with self._lock:
            pending, self._sending = self._sending, None
            if pending is not None:
                pending.result()
            if then is not None:
                self._sending = then()

    def drain(self, timeout: float | None = None) -> dict[str, list]:
        return self.handle.call(TelemetryHub.drain, timeout=timeout)
