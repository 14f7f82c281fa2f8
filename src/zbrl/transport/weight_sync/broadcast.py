"""Weight sync over a torch.distributed group of its own (``transport.weight_sync.type:
broadcast``): consumer rank 0 sends every new version to all producers and the evaluator with
collective broadcasts (gloo on CPU, NCCL on GPU).

Design
------
*The group is separate from training.* It is built from ``torch.distributed`` process-group
objects directly (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` on a key-value store of its own),
never through ``init_process_group``, so it neither uses nor disturbs the default group that
data-parallel consumers train in. Rank 0 is the sender (the consumer of training rank 0); ranks
1.. are the receivers, in the order of their names. The sender's endpoint listens on
``transport.weight_sync.address`` (default: its node's Ray address, 127.0.0.1 in a local run);
each receiver's on the local address that routes to it.

*Membership is coordinated by the run's WeightStore actor* (the same actor that announces
versions for the object store). A receiver asks to join with ``request_join(name)`` and gets a
request number; the sender polls the requests (every ``POLL_S``) and, whenever they differ from the
members of its current group, ends that group (an *epoch*) and forms a new one: it announces
``GroupInfo`` (epoch, the sender's address, members, the tensor layout) through the WeightStore,
waits until every member has checked in, and builds the process group with the WeightStore as its
c10d store (:class:`ActorStore`; unlike a ``TCPStore`` it opens no socket, which would listen on
every interface). Members that do not check in within ``join_timeout_s`` are dropped (their request
is forgotten, so a dead receiver cannot block the others), the rest re-form at once. A late or
restarted producer therefore joins a running run by asking: the next epoch includes it, and the
sender re-sends its newest version to the new group first, so a joiner always starts from the
newest weights.

*A version on the wire* is a header broadcast (kind, version, publish time) followed by the
version's bytes: :func:`zbrl.transport.weight_sync.buckets.flatten` copies the state dict into one
flat ``uint8`` staging buffer on the training thread (the only work ``publish`` does; a sent,
superseded staging buffer is reused), and the sender thread broadcasts that buffer in
``bucket_mb`` buckets. A receiver receives every bucket into a flat buffer (reused once nobody
reads it: neither the newest fetched version nor one being loaded) and only then hands the
tensors (views of the buffer) to the caller: a version is swapped in whole or not at all, never
torn. While no
version is published the sender broadcasts a keep-alive header every ``keepalive_s`` so receivers
blocked on the next header stay inside the collective timeout.

*Failures.* A broadcast that fails (a receiver died or left mid-transfer) ends the epoch on the
sender; receivers whose group broke ask to join again, and the sender re-forms the group from the
requests that remain. Three failed epochs in a row without one delivered version make ``publish``
raise, so the consumer (and the run) fails with the cause instead of producers waiting forever.

Limits: one sender (a restarted consumer is not supported: it would need the newest version
back); the sender sends to every member in turn at the speed of the slowest; every (re)formation
re-sends the newest version to every member (it is cheap next to a training step, but frequent
joins cost bandwidth); with NCCL each member needs a GPU and buckets pass through GPU memory
(one bucket at a time). The layout (names, dtypes, shapes) is fixed per epoch: a version with a
different layout forms a new epoch.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist

from zbrl.telemetry.spans import SpanRecorder
from zbrl.transport.weight_sync.base import BackgroundSender, NamedTensors
from zbrl.transport.weight_sync.buckets import Layout, flatten_into, plan_layout, unflatten
from zbrl.transport.weight_sync.object_store import ObjectStoreReceiver
from zbrl.types import WeightsMessage

if TYPE_CHECKING:
    from zbrl.transport.clients import WeightStoreClient

POLL_S = 0.5
"""How often the idle sender looks for join requests, and receivers for a new group."""
MAX_FAILED_EPOCHS = 3
"""Consecutive failed epochs (no version delivered) after which publishing fails."""

# header kinds
VERSION, KEEPALIVE, EPOCH_OVER = 0.0, 1.0, 2.0


@dataclass(frozen=True)
class BroadcastSettings:
    """Everything the broadcast sender and receivers need (built in zbrl.assembly.settings)."""

    bucket_bytes: int
    backend: Literal["gloo", "nccl"]
    address: str  # where the sender's gloo/NCCL endpoint listens
    join_timeout_s: float
    op_timeout_s: float
    keepalive_s: float


@dataclass(frozen=True)
class GroupInfo:
    """One epoch of the broadcast group, as announced through the WeightStore."""

    epoch: int
    addr: str  # the sender's address
    members: tuple[str, ...]  # receivers; member i has rank i + 1
    seqs: tuple[int, ...]  # the join request each member is in this epoch for
    layout: Layout
    backend: str


class ActorStore(dist.Store):
    """A c10d key-value store kept in the WeightStore actor: the rendezvous of one epoch's
    process group. It has no socket of its own (a ``TCPStore`` listens on every interface), so
    a local run stays on loopback; keys live under ``prefix`` (the epoch) and go with it.

    Keep a Python reference to it as long as the process group lives: the group calls back into
    this object, and without the reference the Python half is collected ("Not implemented")."""

    def __init__(self, client: WeightStoreClient, prefix: str, timeout_s: float) -> None:
        super().__init__()
        self._client = client
        self._prefix = prefix
        self._timeout_s = timeout_s

    def set(self, key: str, value: Any) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self._client.kv_set(self._prefix + key, data)

    def get(self, key: str) -> bytes:
        value = self._client.kv_get(self._prefix + key, self._timeout_s)
        if value is None:
            raise TimeoutError(f"rendezvous key {self._prefix + key!r}: none in {self._timeout_s}s")
        return value

    def add(self, key: str, amount: int) -> int:
        return self._client.kv_add(self._prefix + key, amount)

    def check(self, keys: list[str]) -> bool:
        return self._client.kv_check([self._prefix + k for k in keys])

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        for key in keys:
            self.get(key)

    def delete_key(self, key: str) -> bool:
        return self._client.kv_delete(self._prefix + key)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def has_extended_api(self) -> bool:
        return False

    def clone(self) -> ActorStore:
        return ActorStore(self._client, self._prefix, self._timeout_s)


def route_address(target: str) -> str:
    """The local address this machine uses to reach ``target`` (loopback for a loopback
    target): where a receiver's gloo device listens for the sender."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((target, 9))  # UDP: no packet is sent, only the route is chosen
        return s.getsockname()[0]


def check_bindable(address: str) -> None:
    """ValueError naming the setting when the sender cannot listen on ``address`` here."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError as exc:
        raise ValueError(
            f"transport.weight_sync.address={address!r} is not an address of the consumer's "
            f"node ({exc}); unset it to use the node's Ray address"
        ) from None


def make_process_group(
    backend: str, store: Any, rank: int, size: int, timeout_s: float, local_addr: str
) -> Any:
    """A process group outside the default group; gloo bound to ``local_addr``."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local_addr)]
    opts._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, size, opts)


class Collective:
    """A process group and the broadcasts of this module over it (root: rank 0)."""

    def __init__(self, store: ActorStore, pg: Any, backend: str, rank: int) -> None:
        self.store = store  # kept alive as long as the group (see ActorStore)
        self.pg = pg
        self.backend = backend
        self.rank = rank
        self._opts = dist.BroadcastOptions()
        self._opts.rootRank = 0

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast a contiguous CPU tensor from rank 0 into the same tensor on every rank."""
        if self.backend == "nccl":
            on_gpu = tensor.to("cuda")
            self.pg.broadcast([on_gpu], self._opts).wait()
            if self.rank != 0:
                tensor.copy_(on_gpu)
            return
        self.pg.broadcast([tensor], self._opts).wait()

    def header(self, kind: float, version: int = -1, published_at: float = 0.0) -> torch.Tensor:
        head = torch.tensor([kind, float(version), published_at], dtype=torch.float64)
        self.broadcast(head)
        return head

    def send_flat(self, flat: torch.Tensor, layout: Layout) -> None:
        for start, end in layout.buckets():
            self.broadcast(flat[start:end])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pg.shutdown()  # gloo/nccl: release sockets and threads now
        self.pg = None


@dataclass
class _Staged:
    version: int
    published_at: float
    flat: torch.Tensor
    layout: Layout


class BroadcastPublisher(BackgroundSender):
    """Consumer rank 0: flatten to staging on the calling thread, broadcast from a background
    thread to the current group (see the module docstring)."""

    what = "broadcast"
    failure = "weight broadcast"

    def __init__(
        self,
        store: WeightStoreClient,
        settings: BroadcastSettings,
        recorder: SpanRecorder | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """``dtype``: the receivers' inference dtype; floating-point tensors are cast to it as
        they are staged (None: sent as given)."""
        check_bindable(settings.address)
        super().__init__("weight-broadcast", store, recorder, dtype)
        self._s = settings
        self._layout: Layout | None = None
        self._spare: torch.Tensor | None = None  # a sent, superseded staging buffer to reuse
        self._pending: _Staged | None = None
        self._epoch = 0
        self.epochs_formed = 0
        self._thread.start()

    # WeightPublisher protocol
    def publish(self, version: int, named_tensors: NamedTensors) -> None:
        self._raise_if_failed()
        layout = self._layout
        wanted = plan_layout(named_tensors, 1, self._dtype).signature()
        if layout is None or layout.signature() != wanted:
            layout = self._layout = plan_layout(named_tensors, self._s.bucket_bytes, self._dtype)
        with self._cond:
            spare, self._spare = self._spare, None
        if spare is None or spare.numel() != layout.total_bytes:
            spare = torch.empty(layout.total_bytes, dtype=torch.uint8)
        flat = flatten_into(named_tensors, layout, spare)
        staged = _Staged(version, time.time(), flat, layout)  # stamped when staged, as the store
        with self._cond:
            self._pending = staged
            self._cond.notify_all()

    # the sender thread
    def _send_loop(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # surfaced on the next publish/flush
            self._keep_error(exc)

    def _loop(self) -> None:
        group: Collective | None = None
        info: GroupInfo | None = None
        latest: _Staged | None = None
        failures = 0
        last_header = time.monotonic()
        try:
            while True:
                with self._cond:
                    if self._pending is None and not self._closed:
                        self._cond.wait(POLL_S)
                    fresh, closed = self._pending, self._closed
                if closed:
                    return
                if fresh is not None:
                    if latest is not None and latest is not fresh:
                        with self._cond:  # sent and superseded: publish may refill it
                            self._spare = latest.flat
                    latest = fresh
                wanted = self._store.join_requests()
                stale = info is not None and (
                    dict(zip(info.members, info.seqs, strict=True)) != wanted
                    or (latest is not None and info.layout.signature() != latest.layout.signature())
                )
                if group is not None and stale:
                    self._end(group)
                    group = info = None
                to_send = fresh
                if group is None and wanted and latest is not None:
                    try:
                        formed = self._form(wanted, latest.layout)
                    except Exception:
                        failures += 1
                        if failures >= MAX_FAILED_EPOCHS:
                            raise
                        continue
                    if formed is None:
                        continue  # members missing were dropped; re-form with the rest
                    group, info = formed
                    to_send = latest  # a new group starts from the newest version
                if group is not None and to_send is not None:
                    try:
                        self._send(group, to_send)
                        failures = 0
                    except Exception:
                        group.close()
                        group = info = None
                        failures += 1
                        if failures >= MAX_FAILED_EPOCHS:
                            raise
                        continue  # `fresh` stays pending; a new group gets it
                    last_header = time.monotonic()
                elif group is not None and time.monotonic() - last_header > self._s.keepalive_s:
                    try:
                        group.header(KEEPALIVE)
                    except Exception:
                        group.close()
                        group = info = None
                    last_header = time.monotonic()
                if fresh is not None:  # sent, or kept as `latest` for the next group
                    self._store.announce(WeightsMessage(fresh.version, fresh.published_at, None))
                    with self._cond:
                        if self._pending is fresh:
                            self._pending = None
                        self._sent_version = fresh.version
                        self._cond.notify_all()
        finally:
            if group is not None:
                self._end(group)

    def _send(self, group: Collective, staged: _Staged) -> None:
        start = time.time()
        group.header(VERSION, staged.version, staged.published_at)
        group.send_flat(staged.flat, staged.layout)
        self._record_publish(start, staged.version, staged.layout.total_bytes)

    def _end(self, group: Collective) -> None:
        with contextlib.suppress(Exception):  # members that are gone will notice on their own
            group.header(EPOCH_OVER)
        group.close()

    def _form(
        self, wanted: Mapping[str, int], layout: Layout
    ) -> tuple[Collective, GroupInfo] | None:
        """A new epoch with the members of ``wanted``; None when some did not check in (they
        are dropped from the requests)."""
        s = self._s
        self._store.kv_clear(f"e{self._epoch}/")  # the previous epoch's rendezvous
        self._epoch += 1
        prefix = f"e{self._epoch}/"
        members = tuple(sorted(wanted))
        seqs = tuple(wanted[m] for m in members)
        info = GroupInfo(self._epoch, s.address, members, seqs, layout, s.backend)
        self._store.set_group(info)
        deadline = time.monotonic() + s.join_timeout_s
        missing = list(members)
        while missing and time.monotonic() < deadline:
            missing = [m for m in missing if not self._store.kv_check([f"{prefix}joined/{m}"])]
            if missing:
                time.sleep(0.02)
        if missing:
            for m in missing:
                self._store.drop_member(m, wanted[m])
            self._store.kv_set(f"{prefix}status", b"abort")
            return None
        self._store.kv_set(f"{prefix}status", b"go")
        kv = ActorStore(self._store, prefix + "pg/", s.join_timeout_s)
        pg = make_process_group(s.backend, kv, 0, len(members) + 1, s.op_timeout_s, s.address)
        self.epochs_formed += 1
        return Collective(kv, pg, s.backend, 0), info


class BroadcastReceiver(ObjectStoreReceiver):
    """A producer's or the evaluator's side: joins the group under ``member`` and receives every
    version broadcast to it in a background thread; the caller swaps the newest one in with
    ``receive_into`` (inherited: ``poll``, ``wait_for``, ``latencies_s``).

    Receive buffers are reused (a fresh buffer costs a page fault per page inside the receive,
    which on loopback more than doubles the wire time, see docs/scaling.md): a buffer is received
    into again only when it is neither the newest fetched version nor being loaded, so ``load``
    must copy what it keeps (``load_weights`` of every backend does)."""

    def __init__(
        self,
        store: WeightStoreClient,
        settings: BroadcastSettings,
        member: str,
        recorder: SpanRecorder | None = None,
        *,
        initial_version: int,
    ) -> None:
        self._s = settings
        self._member = member
        self.epochs_joined = 0
        self._free: list[torch.Tensor] = []  # buffers nobody reads: received into again
        self._fetched_flat: torch.Tensor | None = None
        self._loading_flat: torch.Tensor | None = None
        super().__init__(store, recorder, POLL_S, initial_version=initial_version)

    def receive_into(self, load: Callable[[dict[str, torch.Tensor]], Any]) -> bool:
        self._raise_if_failed()
        with self._cond:
            message, flat = self._fetched, self._fetched_flat
            if message is None or message.version <= self._loaded_version:
                return False
            self._loading_flat = flat  # not received into while `load` reads it
        start = time.time()
        try:
            load(message.payload)
        finally:
            with self._cond:
                self._loading_flat = None
                if flat is not self._fetched_flat:  # superseded while loading
                    self._free.append(flat)
        self._mark_loaded(message, start)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        with contextlib.suppress(Exception):
            self._store.leave(self._member)
        self._thread.join(timeout=max(10.0, 2 * self._s.keepalive_s))

    def _loop(self) -> None:
        try:
            seq = self._store.request_join(self._member)
            have_epoch = -1
            while not self._closed:
                info = self._store.wait_for_group(have_epoch, POLL_S)
                if info is None:
                    continue
                have_epoch = info.epoch
                if self._member not in info.members:
                    continue
                if info.seqs[info.members.index(self._member)] != seq:
                    continue  # formed for an older request of this name
                group = self._join(info)
                if group is None:
                    continue
                try:
                    self._receive_epoch(group, info.layout)
                except Exception:  # the group broke: ask again, the sender re-forms
                    if not self._closed:
                        seq = self._store.request_join(self._member)
                finally:
                    group.close()
        except BaseException as exc:
            self._keep_error(exc)

    def _join(self, info: GroupInfo) -> Collective | None:
        s = self._s
        rank = info.members.index(self._member) + 1
        size = len(info.members) + 1
        prefix = f"e{info.epoch}/"
        self._store.kv_set(f"{prefix}joined/{self._member}", b"1")
        if self._store.kv_get(f"{prefix}status", s.join_timeout_s) != b"go":
            return None
        kv = ActorStore(self._store, prefix + "pg/", s.join_timeout_s)
        local = route_address(info.addr)
        pg = make_process_group(info.backend, kv, rank, size, s.op_timeout_s, local)
        self.epochs_joined += 1
        return Collective(kv, pg, info.backend, rank)

    def _receive_epoch(self, group: Collective, layout: Layout) -> None:
        while not self._closed:
            head = group.header(KEEPALIVE)  # overwritten by the sender's header
            kind = float(head[0])
            if kind == KEEPALIVE:
                continue
            if kind == EPOCH_OVER:
                return
            version, published_at = int(head[1]), float(head[2])
            flat = self._take_buffer(layout.total_bytes)
            group.send_flat(flat, layout)  # receives on ranks > 0
            with self._cond:
                if self._fetched is None or version > self._fetched.version:
                    old = self._fetched_flat
                    self._fetched = WeightsMessage(version, published_at, unflatten(flat, layout))
                    self._fetched_flat = flat
                    if old is not None and old is not self._loading_flat:
                        self._free.append(old)
                    self._cond.notify_all()
                else:
                    self._free.append(flat)

    def _take_buffer(self, nbytes: int) -> torch.Tensor:
        with self._cond:
            while self._free:
                buffer = self._free.pop()
                if buffer.numel() == nbytes:
                    self._free.clear()  # keep at most the one reused
                    return buffer
        return torch.empty(nbytes, dtype=torch.uint8)
