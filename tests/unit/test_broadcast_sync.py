"""Broadcast weight sync over gloo on loopback, sender and receivers in one process (threads)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import torch

from helpers.procs import is_loopback, listeners_of
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.broadcast import (
    BroadcastPublisher,
    BroadcastReceiver,
    BroadcastSettings,
)
from zbrl.transport.weight_sync.buckets import flatten, plan_layout, unflatten
from zbrl.transport.weight_sync.store import WeightStore

SETTINGS = BroadcastSettings(
    bucket_bytes=4096,  # several buckets per version, one tensor split across buckets
    backend="gloo",
    address="127.0.0.1",
    join_timeout_s=20.0,
    op_timeout_s=30.0,
    keepalive_s=0.5,
)


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(37, 16, generator=g).to(torch.bfloat16),
        "layer.0.w": torch.randn(64, 33, generator=g),
        "layer.0.b": torch.randn(33, generator=g),
        "norm.scale": torch.tensor(1.5 + seed),  # a 0-d tensor
        "steps": torch.arange(5, dtype=torch.int64) * seed,
    }


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def test_layout_round_trip_keeps_every_byte():
    w = _weights(3)
    layout = plan_layout(w, 100)
    assert all(s.offset % 64 == 0 for s in layout.slots)
    spans = layout.buckets()
    assert spans[0] == (0, 100) and spans[-1][1] == layout.total_bytes and len(spans) > 50
    _same(unflatten(flatten(w, layout), layout), w)


def _loaded(receiver: BroadcastReceiver, version: int) -> dict[str, torch.Tensor]:
    assert receiver.wait_for(version, timeout=60), f"version {version} never arrived"
    box: dict[str, torch.Tensor] = {}
    assert receiver.receive_into(lambda state: box.update({k: v.clone() for k, v in state.items()}))
    assert receiver.loaded_version == version
    return box


def test_versions_reach_every_receiver_whole_and_a_late_joiner_gets_the_newest():
    store = WeightStoreClient(LocalHandle(WeightStore()))
    a = BroadcastReceiver(store, SETTINGS, "producer-0", initial_version=0)
    b = BroadcastReceiver(store, SETTINGS, "producer-1", initial_version=0)
    pub = BroadcastPublisher(store, SETTINGS)
    late = None
    try:
        w1 = _weights(1)
        pub.publish(1, w1)
        pub.flush(60)
        _same(_loaded(a, 1), w1)
        _same(_loaded(b, 1), w1)
        w1["layer.0.w"].zero_()  # publish took a copy: changing the source afterwards is harmless
        w2 = _weights(2)
        pub.publish(2, w2)
        pub.flush(60)
        _same(_loaded(a, 2), w2)
        assert b.wait_for(2, timeout=60)
        # a receiver that starts late (or restarts) joins the running group and gets version 2
        late = BroadcastReceiver(store, SETTINGS, "evaluator", initial_version=0)
        _same(_loaded(late, 2), w2)
        assert pub.epochs_formed >= 2 and late.epochs_joined == 1
        # and the re-formed group carries the next version to everybody
        w3 = _weights(3)
        pub.publish(3, w3)
        pub.flush(60)
        for r in (a, b, late):
            _same(_loaded(r, 3), w3)
        assert min(a.latencies_s) >= 0
        assert store.latest_version() == 3
    finally:
        pub.close()
        for r in (a, b, late):
            if r is not None:
                r.close()


def test_a_restarted_receiver_of_the_same_name_rejoins():
    store = WeightStoreClient(LocalHandle(WeightStore()))
    a = BroadcastReceiver(store, SETTINGS, "producer-0", initial_version=0)
    pub = BroadcastPublisher(store, SETTINGS)
    again = None
    try:
        pub.publish(1, _weights(1))
        _loaded(a, 1)
        a.close()  # the producer goes away ...
        again = BroadcastReceiver(store, SETTINGS, "producer-0", initial_version=0)
        _same(_loaded(again, 1), _weights(1))  # ... and its restart gets the newest version
        pub.publish(2, _weights(2))
        _same(_loaded(again, 2), _weights(2))
    finally:
        pub.close()
        if again is not None:
            again.close()


def test_a_member_that_never_comes_is_dropped_and_the_rest_get_weights():
    store = WeightStoreClient(LocalHandle(WeightStore()))
    store.request_join("producer-9")  # asked to join, then died before it came
    short = dataclasses.replace(SETTINGS, join_timeout_s=1.0)
    a = BroadcastReceiver(store, short, "producer-0", initial_version=0)
    pub = BroadcastPublisher(store, short)
    try:
        pub.publish(1, _weights(1))
        _same(_loaded(a, 1), _weights(1))
        assert "producer-9" not in store.join_requests()
    finally:
        pub.close()
        a.close()


def test_the_group_listens_on_loopback_only():
    store = WeightStoreClient(LocalHandle(WeightStore()))
    a = BroadcastReceiver(store, SETTINGS, "producer-0", initial_version=0)
    pub = BroadcastPublisher(store, SETTINGS)
    try:
        before = listeners_of(os.getpid())
        pub.publish(1, _weights(1))
        _loaded(a, 1)
        opened = listeners_of(os.getpid()) - before
        assert opened, "the group opened no listening socket"
        assert all(is_loopback(address) for _, address, _ in opened), opened
    finally:
        pub.close()
        a.close()


def test_a_slow_loader_never_sees_a_torn_version_while_buffers_are_reused():
    store = WeightStoreClient(LocalHandle(WeightStore()))
    receiver = BroadcastReceiver(store, SETTINGS, "producer-0", initial_version=0)
    pub = BroadcastPublisher(store, SETTINGS)
    shapes = {f"w{i}": (300,) for i in range(8)}  # 8 x 1200 bytes: a version spans 3 buckets
    seen: list[float] = []

    def slow_load(state: dict[str, torch.Tensor]) -> None:
        values = set()
        for tensor in state.values():
            values.update(tensor.unique().tolist())
            time.sleep(0.002)  # the receiver gets newer versions meanwhile
        assert len(values) == 1, f"a torn version: {sorted(values)}"
        seen.append(values.pop())

    def publish_all() -> None:
        for version in range(1, 61):
            pub.publish(version, {k: torch.full(s, float(version)) for k, s in shapes.items()})
            time.sleep(0.001)  # several versions arrive during one load

    publisher = threading.Thread(target=publish_all)
    try:
        publisher.start()
        while publisher.is_alive():
            receiver.receive_into(slow_load)
        publisher.join()
        pub.flush(60)
        assert receiver.wait_for(60, timeout=60)
        receiver.receive_into(slow_load)
    finally:
        publisher.join()
        pub.close()
        receiver.close()
    assert seen[-1] == 60.0 and seen == sorted(seen) and len(seen) >= 3
