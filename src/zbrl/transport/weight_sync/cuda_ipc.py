"""Weight sync by CUDA IPC handles where it can, the object store where it cannot
(``transport.weight_sync.type: cuda_ipc``; docs/scaling.md, "The same-GPU handoff").

The consumer (:class:`CudaIpcPublisher`) casts each version to the inference dtype into a set of
flat CUDA buffers (:func:`~zbrl.transport.weight_sync.buckets.plan_buckets`: whole tensors, at most
``bucket_bytes`` per buffer). Every buffer is exported once as a CUDA IPC handle when it is
allocated; a version's announcement through the weight store carries only the handles, the
layouts (names, dtypes, shapes, offsets) and the publisher's :class:`~.routes.Endpoint`. A
receiver (:class:`CudaIpcReceiver`) on the same machine that sees the consumer's GPU maps the
buffers once and hands ``receive_into``'s ``load`` views of them (the load copies GPU to GPU);
any other receiver gets the version through the object store, which the publisher fills only
while such a receiver is registered (:func:`~.routes.choose_route`, one log line in the receiver
saying why).

Never torn, never blocking training: the publisher keeps ``buffers`` sets of buffers (2 by
default). A receiver *holds* a version in the weight store from the moment it takes the
announcement (atomically, :meth:`~.store.WeightStore.acquire_newer`) until it has loaded it (and
its copies finished) or a newer one superseded it; the publisher writes the next version only into
a set that is neither the announced one nor held. With two sets the consumer waits only when a
receiver is in the middle of loading the older of two versions published since; a holder whose
process is gone is forgotten; a live one that holds a set longer than ``release_timeout_s`` makes
``publish`` raise with its name.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from zbrl.telemetry.spans import SpanRecorder
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.weight_sync.base import BackgroundSender, NamedTensors
from zbrl.transport.weight_sync.buckets import Layout, flatten_into, plan_buckets, unflatten
from zbrl.transport.weight_sync.ipc_handles import CudaSharer, Sharer
from zbrl.transport.weight_sync.object_store import ObjectStoreReceiver, cpu_copy, payload_bytes
from zbrl.transport.weight_sync.routes import (
    CUDA_IPC,
    OBJECT_STORE,
    Endpoint,
    Route,
    choose_route,
    local_endpoint,
)
from zbrl.types import WeightsMessage

DEFAULT_BUCKET_BYTES = 256 * 2**20


@dataclass(frozen=True)
class SharedBucket:
    """One exported flat buffer."""

    key: str
    """Unique per exported buffer (a receiver maps each key once)."""
    handle: Any
    """The sharer's handle (for CUDA: torch's rebuild arguments)."""


@dataclass(frozen=True)
class Handoff:
    """The payload of one version's announcement under ``cuda_ipc``."""

    source: Endpoint
    """Where the publisher runs and which GPU its buffers are on."""
    layouts: tuple[Layout, ...]
    """One per shared bucket: where each tensor sits in it."""
    buckets: tuple[SharedBucket, ...] | None
    """The shared buffers holding this version (None: the weights were not on a device the
    sharer exports, only ``fallback`` carries them)."""
    fallback: Any
    """The version in the object store for receivers routed there (None while none is)."""

    @property
    def nbytes(self) -> int:
        return sum(layout.total_bytes for layout in self.layouts)


class _BufferSet:
    """One set of shared buffers (a flat buffer per bucket) and the version written into it."""

    def __init__(self, buffers: list[torch.Tensor], shared: tuple[SharedBucket, ...]) -> None:
        self.buffers = buffers
        self.shared = shared
        self.version = -1
        self.busy = False  # the sender thread is announcing or copying it


@dataclass
class _Staged:
    """What ``publish`` hands the sender thread."""

    version: int
    staged_at: float
    copy: dict[str, torch.Tensor] | None = None  # weights not shareable: a CPU copy
    buffers: _BufferSet | None = None  # or a written buffer set
    layouts: tuple[Layout, ...] = ()
    source: Endpoint | None = None
    ready: Any = None  # a CUDA event recorded after the copy into ``buffers``


def _device_of(named_tensors: NamedTensors) -> torch.device | None:
    for tensor in named_tensors.values():
        return tensor.device
    return None


class CudaIpcPublisher(BackgroundSender):
    """Consumer side of the handoff (see the module docstring)."""

    what = "published"
    failure = "weight publishing"

    def __init__(
        self,
        store: WeightStoreClient,
        recorder: SpanRecorder | None = None,
        dtype: torch.dtype | None = None,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        buffers: int = 2,
        release_timeout_s: float = 120.0,
        sharer: Sharer | None = None,
        endpoint: Callable[[torch.device | None], Endpoint] = local_endpoint,
    ) -> None:
        """``dtype``: the receivers' inference dtype (floating-point weights are cast to it);
        ``buffers``: sets of shared buffers (>= 2); ``sharer``, ``endpoint``: how buffers are
        exported and where this process is (tests replace both)."""
        if buffers < 2:
            raise ValueError(f"transport.weight_sync.buffers must be >= 2, got {buffers}")
        super().__init__("weight-handoff", store, recorder, dtype)
        self._bucket_bytes = bucket_bytes
        self._max_sets = buffers
        self._release_timeout_s = release_timeout_s
        self._sharer = sharer if sharer is not None else CudaSharer()
        self._endpoint = endpoint
        self._sets: list[_BufferSet] = []
        self._signature: tuple | None = None
        self._announced = -1  # the newest version the store announces
        self._source: dict[str, Endpoint] = {}  # endpoint by device
        self._keys = 0
        self._side_stream: Any = None  # the background thread's CUDA stream for host copies
        self.waited_s = 0.0
        """Seconds ``publish`` waited for a free buffer set, in all."""
        self.peak_buffer_sets = 0
        """The most buffer sets held at once (kept after :meth:`close`, which drops them)."""
        self._thread.start()

    @property
    def buffer_sets(self) -> int:
        """Buffer sets allocated so far."""
        return len(self._sets)

    def publish(self, version: int, named_tensors: NamedTensors) -> None:
        """Copy ``version`` into a free buffer set (cast to ``dtype``) and return; announcing
        (and any object-store copy) happens in the background."""
        self._raise_if_failed()
        device = _device_of(named_tensors)
        source = self._source_at(device)
        if device is None or source.gpu is None or not self._sharer.can_share(device):
            staged = _Staged(version, time.time(), copy=cpu_copy(named_tensors, self._dtype))
            staged.source = source
        else:
            staged = self._stage_shared(version, named_tensors, device, source)
        with self._cond:
            self._pending = staged
            self._cond.notify_all()

    def _source_at(self, device: torch.device | None) -> Endpoint:
        key = str(device)
        if key not in self._source:
            self._source[key] = self._endpoint(device)
        return self._source[key]

    def _stage_shared(
        self, version: int, named_tensors: NamedTensors, device: torch.device, source: Endpoint
    ) -> _Staged:
        layouts = tuple(plan_buckets(named_tensors, self._bucket_bytes, self._dtype))
        signature = (str(device), tuple(layout.signature() for layout in layouts))
        if signature != self._signature:  # first version, or the weights changed shape
            self._sets = []  # torch keeps a buffer a receiver still maps until it lets go
            self._signature = signature
        target = self._free_set(layouts, device)
        for layout, flat in zip(layouts, target.buffers, strict=True):
            flatten_into(named_tensors, layout, flat)
        target.version = version
        ready = None
        if device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(device))
        return _Staged(
            version, time.time(), buffers=target, layouts=layouts, source=source, ready=ready
        )

    def _free_set(self, layouts: tuple[Layout, ...], device: torch.device) -> _BufferSet:
        """A buffer set no receiver may read: not the announced version's, not pending, not
        held; a new one while fewer than ``buffers`` exist; else wait for a release."""
        start = time.monotonic()
        pause = 0.002
        while True:
            found = self._unused_set(self._store.holders() if self._sets else {})
            if found is not None:
                break
            if len(self._sets) < self._max_sets:
                found = self._new_set(layouts, device)
                break
            self._forget_dead_holders()
            waited = time.monotonic() - start
            if waited > self._release_timeout_s:
                raise RuntimeError(self._timeout_message())
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        self.waited_s += time.monotonic() - start
        return found

    def _unused_set(self, holders: dict[int, list[str]]) -> _BufferSet | None:
        with self._cond:
            pending = self._pending.buffers if self._pending is not None else None
            for candidate in self._sets:
                if candidate.busy or candidate is pending:
                    continue
                if candidate.version < 0:  # never written
                    return candidate
                if candidate.version == self._announced or candidate.version in holders:
                    continue
                return candidate
            ours = any(pending is candidate for candidate in self._sets)  # not an old layout's
            if pending is not None and ours and not pending.busy and pending.version not in holders:
                # superseded before the sender took it: never announced, so nobody reads it
                self._pending = None
                return pending
        return None

    def _new_set(self, layouts: tuple[Layout, ...], device: torch.device) -> _BufferSet:
        buffers = [torch.empty(x.total_bytes, dtype=torch.uint8, device=device) for x in layouts]
        shared = []
        for flat in buffers:
            self._keys += 1
            key = f"{os.getpid()}:{id(self)}:{self._keys}"
            shared.append(SharedBucket(key, self._sharer.share(flat)))
        new = _BufferSet(buffers, tuple(shared))
        self._sets.append(new)
        self.peak_buffer_sets = max(self.peak_buffer_sets, len(self._sets))
        return new

    def _forget_dead_holders(self) -> None:
        """Drop the holds of receivers on this machine whose process has exited."""
        holders = self._store.holders()
        if not holders:
            return
        here = next(iter(self._source.values())).host if self._source else None
        receivers = self._store.receivers()
        held_by = {m for members in holders.values() for m in members}
        for member in held_by:
            endpoint = receivers.get(member)
            if endpoint is None or (endpoint.host == here and not _alive(endpoint.pid)):
                self._store.drop_holds(member)

    def _timeout_message(self) -> str:
        holders = self._store.holders()
        who = ", ".join(
            f"{', '.join(sorted(members))} (version {version})"
            for version, members in sorted(holders.items())
        )
        return (
            f"CUDA weight handoff: all {self._max_sets} buffer sets still held after "
            f"transport.weight_sync.release_timeout_s={self._release_timeout_s}s by {who or '?'}; "
            "a receiver is stuck in a weight load. Raise transport.weight_sync.buffers (one more "
            "copy of the weights in GPU memory each) or release_timeout_s, or use "
            "transport.weight_sync.type=object_store"
        )

    def close(self) -> None:
        super().close()
        self._sets = []

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                staged: _Staged = self._pending
                if staged.buffers is not None:
                    staged.buffers.busy = True
            try:
                announced = self._send(staged)
            except BaseException as exc:  # surfaced on the next publish/flush
                with self._cond:
                    self._error = exc
                    self._pending = None
                    if staged.buffers is not None:
                        staged.buffers.busy = False
                    self._cond.notify_all()
                return
            with self._cond:
                if self._pending is staged:
                    self._pending = None
                if staged.buffers is not None:
                    staged.buffers.busy = False
                if announced:
                    self._announced = staged.version
                self._sent_version = staged.version
                self._cond.notify_all()

    def _send(self, staged: _Staged) -> bool:
        start = time.time()
        if staged.ready is not None:
            staged.ready.synchronize()  # the copy into the buffers is done before anyone reads
        assert staged.source is not None
        routes = self._routes(staged.source) if staged.buffers is not None else {}
        fallback = None
        if staged.copy is not None:
            fallback = self._store.put_payload(staged.copy)
        elif any(route.kind == OBJECT_STORE for route in routes.values()):
            fallback = self._store.put_payload(self._host_copy(staged))
        handoff = Handoff(
            staged.source,
            staged.layouts,
            staged.buffers.shared if staged.buffers is not None else None,
            fallback,
        )
        announced = self._store.announce(WeightsMessage(staged.version, staged.staged_at, handoff))
        nbytes = handoff.nbytes if staged.copy is None else payload_bytes(staged.copy)
        ipc_receivers = sum(route.kind == CUDA_IPC for route in routes.values())
        self._record_publish(start, staged.version, nbytes, ipc_receivers=ipc_receivers)
        return announced

    def _routes(self, source: Endpoint) -> dict[str, Route]:
        return {
            member: choose_route(source, endpoint, member)
            for member, endpoint in self._store.receivers().items()
        }

    def _host_copy(self, staged: _Staged) -> dict[str, torch.Tensor]:
        """The version as separate CPU tensors (for the object store), copied on a side CUDA
        stream: training's kernels on the default stream do not queue behind the copy."""
        assert staged.buffers is not None
        first = staged.buffers.buffers[0]
        side = contextlib.nullcontext()
        if first.is_cuda:
            if self._side_stream is None:
                self._side_stream = torch.cuda.Stream(first.device)
            side = torch.cuda.stream(self._side_stream)
        out: dict[str, torch.Tensor] = {}
        with side:
            for layout, flat in zip(staged.layouts, staged.buffers.buffers, strict=True):
                for name, view in unflatten(flat, layout).items():
                    out[name] = view.to("cpu", copy=True)  # waits for the copy
        return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Fetched:
    """A version ready to load; ``held`` while its shared buffers are held in the store."""

    version: int
    published_at: float
    payload: dict[str, torch.Tensor]
    held: bool


class CudaIpcReceiver(ObjectStoreReceiver):
    """Producer / evaluator side of the handoff: maps the consumer's buffers when its route is
    ``cuda_ipc``, fetches the object-store copy otherwise (see the module docstring)."""

    def __init__(
        self,
        store: WeightStoreClient,
        member: str,
        recorder: SpanRecorder | None = None,
        poll_interval_s: float = 0.5,
        *,
        initial_version: int = -1,
        sharer: Sharer | None = None,
        endpoint: Endpoint | None = None,
    ) -> None:
        """``member``: this receiver's name (``producer-1``, ``evaluator``); ``sharer``,
        ``endpoint``: how buffers are mapped and where this process is (tests replace both)."""
        self._member = member
        self._sharer = sharer if sharer is not None else CudaSharer()
        self._here = endpoint if endpoint is not None else local_endpoint()
        self._route: Route | None = None
        self._mapped: dict[str, torch.Tensor] = {}  # bucket key -> the mapped buffer
        self._seen = -1  # newest version announced to this receiver
        self._loading: int | None = None
        self._skipped_note = False
        store.register_receiver(member, self._here)
        super().__init__(store, recorder, poll_interval_s, initial_version=initial_version)

    @property
    def route(self) -> Route | None:
        """The route chosen (None before the first version arrived)."""
        return self._route

    def receive_into(self, load: Callable[[dict[str, torch.Tensor]], Any]) -> bool:
        """Load the newest version through ``load`` (for ``cuda_ipc``: views of the consumer's
        buffers; ``load`` copies them), then let the consumer reuse the buffers."""
        self._raise_if_failed()
        with self._cond:
            fetched: _Fetched | None = self._fetched  # type: ignore[assignment]
            if fetched is None or fetched.version <= self._loaded_version:
                return False
            self._loading = fetched.version
        start = time.time()
        try:
            load(fetched.payload)
            if fetched.held:
                self._sharer.settle(list(fetched.payload.values()))
        except BaseException:
            with self._cond:
                self._loading = None
            raise
        with self._cond:
            self._loading = None
            release, fetched.held = fetched.held, False
        if release:
            self._store.release(self._member, fetched.version)
        self._mark_loaded(fetched, start)  # type: ignore[arg-type]
        return True

    def close(self) -> None:
        super().close()
        with contextlib.suppress(Exception):  # the store may be gone with the run
            self._store.unregister_receiver(self._member)
        self._mapped.clear()

    def _fetch_newer(self) -> None:
        message = self._store.acquire_newer(self._member, self._seen, self._poll_interval_s)
        if message is None:
            return
        self._seen = message.version
        handoff: Handoff = message.payload
        route = self._choose(handoff.source)
        if route.kind == CUDA_IPC and handoff.buckets is not None:
            try:
                payload = self._views(handoff, route.device_index)
            except RuntimeError as exc:  # e.g. no IPC between these processes (containers)
                self._give_up_ipc(message.version, exc)
                return
            self._offer(_Fetched(message.version, message.published_at, payload, held=True))
            return
        self._store.release(self._member, message.version)  # reads no shared buffer
        if handoff.fallback is None:
            if not self._skipped_note:
                self._skipped_note = True
                print(
                    f"[zbrl] weight sync: {self._member} registered after version "
                    f"{message.version} was published without an object-store copy; it loads "
                    "the next version",
                    flush=True,
                )
            return
        payload = self._store.get_payload(handoff.fallback)
        self._offer(_Fetched(message.version, message.published_at, payload, held=False))

    def _give_up_ipc(self, version: int, exc: RuntimeError) -> None:
        """Mapping the consumer's buffers failed: register again as a receiver that sees no
        GPU, so the object store serves it from the next version on."""
        self._here = replace(self._here, gpus=())
        # keep the holds: an older version may be loading from buffers mapped before
        self._store.register_receiver(self._member, self._here, keep_holds=True)
        self._store.release(self._member, version)
        self._route = Route(OBJECT_STORE, f"mapping the consumer's CUDA buffers failed: {exc}")
        print(
            f"[zbrl] weight sync: {self._member} receives over the object store from the version "
            f"after {version}: mapping the consumer's CUDA buffers failed ({exc})",
            flush=True,
        )

    def _choose(self, source: Endpoint) -> Route:
        route = choose_route(source, self._here, self._member)
        if self._route is None or route.kind != self._route.kind:
            how = "CUDA IPC" if route.kind == CUDA_IPC else "the object store"
            print(
                f"[zbrl] weight sync: {self._member} receives over {how}: {route.reason}",
                flush=True,
            )
        self._route = route
        return route

    def _views(self, handoff: Handoff, device_index: int | None) -> dict[str, torch.Tensor]:
        assert handoff.buckets is not None
        views: dict[str, torch.Tensor] = {}
        for layout, bucket in zip(handoff.layouts, handoff.buckets, strict=True):
            flat = self._mapped.get(bucket.key)
            if flat is None:
                flat = self._mapped[bucket.key] = self._sharer.open(bucket.handle, device_index)
            views.update(unflatten(flat, layout))
        return views

    def _offer(self, fetched: _Fetched) -> None:
        with self._cond:
            old: _Fetched | None = self._fetched  # type: ignore[assignment]
            self._fetched = fetched  # type: ignore[assignment]
            self._cond.notify_all()
            drop = old is not None and old.held and self._loading != old.version
            if drop:
                old.held = False
        if drop:
            self._store.release(self._member, old.version)
