"""The weight store: the announcement of the newest published weights, and the broadcast group's
membership and rendezvous (a plain class; an actor in runs, reached through
:class:`zbrl.transport.clients.WeightStoreClient`).

Publishers announce each version here (:mod:`zbrl.transport.weight_sync.object_store`), receivers
long-poll it; the broadcast group (:mod:`zbrl.transport.weight_sync.broadcast`) forms through it.
The CUDA handoff (:mod:`zbrl.transport.weight_sync.cuda_ipc`) keeps its receivers' endpoints here
and their *holds*: the versions whose shared buffers a receiver may still read, which the publisher
must not rewrite.
"""

from __future__ import annotations

import threading
from typing import Any

from zbrl.types import WeightsMessage


class WeightStore:
    """Holds the announcement of the newest published version (a plain class; an actor in runs).

    Reached through :class:`zbrl.transport.clients.WeightStoreClient`.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._latest: WeightsMessage | None = None
        self._wanted: dict[str, int] = {}  # broadcast group: member -> its latest join request
        self._join_seq = 0
        self._group: Any = None
        self._kv: dict[str, bytes] = {}  # the broadcast group's rendezvous (a c10d store)
        self._receivers: dict[str, Any] = {}  # CUDA handoff: member -> its Endpoint
        self._holds: dict[str, set[int]] = {}  # CUDA handoff: member -> versions it may read

    def put(self, message: WeightsMessage) -> bool:
        """Announce ``message``; False (and ignored) when it is not newer than the latest."""
        with self._lock:
            if self._latest is not None and message.version <= self._latest.version:
                return False
            self._latest = message
            self._lock.notify_all()
            return True

    def wait_for_newer(self, have: int, timeout: float) -> int:
        """Block until a version newer than ``have`` exists (or ``timeout``); the latest version.

        Receivers long-poll with this instead of sleeping between polls, so a new version is
        fetched as soon as it is announced.
        """
        with self._lock:
            self._lock.wait_for(lambda: self._version() > have, timeout=timeout)
            return self._version()

    def wait_for_message(self, have: int, timeout: float) -> WeightsMessage | None:
        """The latest announcement once its version is newer than ``have`` (None after
        ``timeout``): the object-store receiver's long poll, one round trip per version (the
        message comes with the wake-up instead of a second call for it)."""
        with self._lock:
            self._lock.wait_for(lambda: self._version() > have, timeout=timeout)
            if self._latest is None or self._latest.version <= have:
                return None
            return self._latest

    def _version(self) -> int:
        return -1 if self._latest is None else self._latest.version

    def latest_version(self) -> int:
        with self._lock:
            return self._version()

    def latest(self) -> WeightsMessage | None:
        with self._lock:
            return self._latest

    # receivers and holds of the CUDA handoff (zbrl.transport.weight_sync.cuda_ipc)
    def register_receiver(self, member: str, endpoint: Any, keep_holds: bool = False) -> None:
        """``member`` receives from now on, at ``endpoint``; a restart replaces the old entry
        and drops its holds (``keep_holds``: a live receiver that only changes its endpoint)."""
        with self._lock:
            self._receivers[member] = endpoint
            if not keep_holds:
                self._holds.pop(member, None)
            self._lock.notify_all()

    def unregister_receiver(self, member: str) -> None:
        with self._lock:
            self._receivers.pop(member, None)
            self._holds.pop(member, None)
            self._lock.notify_all()

    def receivers(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._receivers)

    def acquire_newer(self, member: str, have: int, timeout: float) -> WeightsMessage | None:
        """The latest announcement once its version is newer than ``have`` (None after
        ``timeout``), held for ``member`` in the same step: the publisher sees the hold before it
        could rewrite that version's buffers."""
        with self._lock:
            self._lock.wait_for(lambda: self._version() > have, timeout=timeout)
            if self._latest is None or self._latest.version <= have:
                return None
            self._holds.setdefault(member, set()).add(self._latest.version)
            return self._latest

    def release(self, member: str, version: int) -> None:
        """``member`` no longer reads ``version``'s buffers."""
        with self._lock:
            self._holds.get(member, set()).discard(version)
            self._lock.notify_all()

    def holders(self) -> dict[int, list[str]]:
        """Held versions and the members holding each."""
        with self._lock:
            held: dict[int, list[str]] = {}
            for member, versions in self._holds.items():
                for version in versions:
                    held.setdefault(version, []).append(member)
            return held

    def drop_holds(self, member: str) -> None:
        """Forget ``member``'s holds (its process is gone)."""
        with self._lock:
            self._holds.pop(member, None)
            self._lock.notify_all()

    # group membership of broadcast weight sync (zbrl.transport.weight_sync.broadcast)
    def request_join(self, member: str) -> int:
        """``member`` wants to be in the broadcast group (again); returns its request number."""
        with self._lock:
            self._join_seq += 1
            self._wanted[member] = self._join_seq
            self._lock.notify_all()
            return self._join_seq

    def leave(self, member: str) -> None:
        with self._lock:
            self._wanted.pop(member, None)
            self._lock.notify_all()

    def drop_member(self, member: str, seq: int) -> None:
        """Forget ``member``'s request ``seq`` (it did not come to a group); a newer request of
        the same member (a restart) stays."""
        with self._lock:
            if self._wanted.get(member) == seq:
                del self._wanted[member]
                self._lock.notify_all()

    def join_requests(self) -> dict[str, int]:
        with self._lock:
            return dict(self._wanted)

    def set_group(self, group: Any) -> None:
        """Announce a newly formed broadcast group (a ``GroupInfo``)."""
        with self._lock:
            self._group = group
            self._lock.notify_all()

    # key-value rendezvous of the broadcast group's process group (broadcast.ActorStore)
    def kv_set(self, key: str, value: bytes) -> None:
        with self._lock:
            self._kv[key] = value
            self._lock.notify_all()

    def kv_get(self, key: str, timeout: float) -> bytes | None:
        """The value of ``key`` once it is set (None after ``timeout`` seconds)."""
        with self._lock:
            self._lock.wait_for(lambda: key in self._kv, timeout=timeout)
            return self._kv.get(key)

    def kv_add(self, key: str, amount: int) -> int:
        with self._lock:
            value = int(self._kv.get(key, b"0")) + amount
            self._kv[key] = str(value).encode()
            self._lock.notify_all()
            return value

    def kv_check(self, keys: list[str]) -> bool:
        with self._lock:
            return all(k in self._kv for k in keys)

    def kv_delete(self, key: str) -> bool:
        with self._lock:
            return self._kv.pop(key, None) is not None

    def kv_clear(self, prefix: str) -> None:
        """Forget every key under ``prefix`` (a finished epoch's rendezvous)."""
        with self._lock:
            for key in [k for k in self._kv if k.startswith(prefix)]:
                del self._kv[key]

    def wait_for_group(self, have_epoch: int, timeout: float) -> Any:
        """The group info once its epoch is newer than ``have_epoch`` (None on timeout)."""
        with self._lock:
            self._lock.wait_for(
                lambda: self._group is not None and self._group.epoch > have_epoch,
                timeout=timeout,
            )
            if self._group is not None and self._group.epoch > have_epoch:
                return self._group
            return None
