"""Object-store weight sync (WeightStore, ObjectStorePublisher, ObjectStoreReceiver) over
in-process handles (no Ray)."""

import threading
import time

import pytest
import torch

from zbrl.config import load_config
from zbrl.telemetry.spans import SpanRecorder
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.factory import build_publisher, build_receiver
from zbrl.transport.weight_sync.object_store import (
    ObjectStorePublisher,
    ObjectStoreReceiver,
    cpu_copy,
)
from zbrl.transport.weight_sync.store import WeightStore
from zbrl.types import WeightsMessage

WAIT = 10.0  # generous upper bound for waits on background threads (never hit when passing)


class GatedHandle(LocalHandle):
    """A store handle whose ``put_object`` blocks until the test opens the gate."""

    def __init__(self, store):
        super().__init__(store)
        self.gate = threading.Event()
        self.started = threading.Event()
        self.sent = threading.Event()
        self.put_versions = []  # versions whose payload reached put_object, in order

    def put_object(self, value):
        self.put_versions.append(int(value["v"]))
        self.started.set()
        assert self.gate.wait(WAIT), "test never opened the gate"
        self.sent.set()
        return value


class FailingHandle(LocalHandle):
    def __init__(self, store, *, put_fails=False, get_fails=False):
        super().__init__(store)
        self.put_fails, self.get_fails = put_fails, get_fails

    def put_object(self, value):
        if self.put_fails:
            raise ConnectionError("object store unreachable")
        return value

    def get_object(self, payload, timeout=None):
        if self.get_fails:
            raise ConnectionError("object lost")
        return payload


def state(v, size=3):
    return {"v": torch.tensor(float(v)), "w": torch.full((size,), float(v))}


@pytest.fixture
def closers():
    items = []
    yield items
    for item in items:
        item.close()


def test_store_keeps_newest_version_and_never_goes_back():
    store = WeightStore()
    assert store.latest_version() == -1 and store.latest() is None
    assert store.put(WeightsMessage(3, 0.0, "p3"))
    assert not store.put(WeightsMessage(2, 0.0, "p2"))
    assert not store.put(WeightsMessage(3, 0.0, "p3b"))
    assert store.latest_version() == 3 and store.latest().payload == "p3"
    assert store.put(WeightsMessage(4, 0.0, "p4"))
    assert store.latest().payload == "p4"


def test_cpu_copy_is_detached_and_independent():
    t = torch.ones(2, requires_grad=True)
    copy = cpu_copy({"t": t})
    assert not copy["t"].requires_grad
    with torch.no_grad():
        t.add_(1.0)
    assert copy["t"].tolist() == [1.0, 1.0]


def test_publish_returns_before_the_send_finishes(closers):
    store = WeightStore()
    handle = GatedHandle(store)
    pub = ObjectStorePublisher(
        WeightStoreClient(handle), SpanRecorder("c", "consumer"), send_on_caller_max_bytes=0
    )
    closers.append(pub)
    pub.publish(1, state(1))
    # publish has returned while the background send is (or will be) blocked on the gate
    assert not handle.sent.is_set()
    assert store.latest_version() == -1
    assert pub.sent_version == -1
    assert handle.started.wait(WAIT)
    handle.gate.set()
    pub.flush(timeout=WAIT)
    assert handle.sent.is_set()
    assert store.latest_version() == 1 and pub.sent_version == 1
    assert torch.equal(store.latest().payload["w"], torch.full((3,), 1.0))


def test_newer_staged_version_supersedes_older_unsent(closers):
    store = WeightStore()
    handle = GatedHandle(store)
    pub = ObjectStorePublisher(WeightStoreClient(handle), send_on_caller_max_bytes=0)
    closers.append(pub)
    pub.publish(1, state(1))
    assert handle.started.wait(WAIT)  # v1 is being sent (blocked)
    pub.publish(2, state(2))
    pub.publish(3, state(3))  # v2 was never sent: v3 replaces it in the staging slot
    handle.gate.set()
    pub.flush(timeout=WAIT)
    assert handle.put_versions == [1, 3]
    assert store.latest_version() == 3
    assert store.latest().payload["w"].tolist() == [3.0, 3.0, 3.0]


def test_store_versions_never_go_backwards_through_publisher(closers):
    store = WeightStore()
    pub = ObjectStorePublisher(WeightStoreClient(LocalHandle(store)))
    closers.append(pub)
    pub.publish(5, state(5))
    pub.flush(timeout=WAIT)
    pub.publish(3, state(3))
    pub.flush(timeout=WAIT)
    assert store.latest_version() == 5
    assert store.latest().payload["w"].tolist() == [5.0, 5.0, 5.0]


def test_published_payload_is_a_copy_never_torn(closers):
    model = torch.nn.Linear(3, 2)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    store = WeightStore()
    handle = GatedHandle(store)
    pub = ObjectStorePublisher(WeightStoreClient(handle), send_on_caller_max_bytes=0)
    closers.append(pub)
    pub.publish(1, {**model.state_dict(), "v": torch.tensor(1.0)})
    assert handle.started.wait(WAIT)
    with torch.no_grad():  # the next training step mutates the model while v1 is in flight
        for p in model.parameters():
            p.add_(10.0)
    handle.gate.set()
    pub.flush(timeout=WAIT)
    payload = store.latest().payload
    for k, v in expected.items():
        assert torch.equal(payload[k], v), k
        assert payload[k].data_ptr() != model.state_dict()[k].data_ptr()


def test_flush_times_out_with_clear_message(closers):
    handle = GatedHandle(WeightStore())
    pub = ObjectStorePublisher(WeightStoreClient(handle), send_on_caller_max_bytes=0)
    closers.append(pub)
    pub.publish(1, state(1))
    with pytest.raises(TimeoutError, match="not published within"):
        pub.flush(timeout=0.05)
    handle.gate.set()
    pub.flush(timeout=WAIT)


def test_publisher_background_error_surfaces_on_next_call(closers):
    pub = ObjectStorePublisher(
        WeightStoreClient(FailingHandle(WeightStore(), put_fails=True)), send_on_caller_max_bytes=0
    )
    closers.append(pub)
    pub.publish(1, state(1))  # returns: the failure happens on the background thread
    with pytest.raises(RuntimeError, match=r"weight publishing failed.*object store unreachable"):
        pub.flush(timeout=WAIT)
    with pytest.raises(RuntimeError, match="weight publishing failed"):
        pub.publish(2, state(2))


def test_publisher_records_publish_spans_on_weights_thread(closers):
    rec = SpanRecorder("c", "consumer")
    pub = ObjectStorePublisher(
        WeightStoreClient(LocalHandle(WeightStore())), rec, send_on_caller_max_bytes=0
    )
    closers.append(pub)
    pub.publish(1, state(1))
    pub.flush(timeout=WAIT)
    spans = rec.drain()
    assert [(s["name"], s["thread"], s["attrs"]["version"]) for s in spans] == [
        ("publish_weights", "weights", 1)
    ]


def test_receiver_fetch_poll_wait_receive_into_order(closers):
    store = WeightStore()
    rec = SpanRecorder("p", "producer")
    receiver = ObjectStoreReceiver(WeightStoreClient(LocalHandle(store)), rec, poll_interval_s=0.01)
    closers.append(receiver)
    loads = []

    def load(sd):
        loads.append((int(sd["v"]), threading.current_thread() is threading.main_thread()))

    assert receiver.poll() == -1 and receiver.loaded_version == -1
    assert receiver.receive_into(load) is False and loads == []
    assert receiver.wait_for(1, timeout=0.05) is False

    store.put(WeightsMessage(1, time.time(), state(1)))
    assert receiver.wait_for(1, timeout=WAIT) is True
    assert receiver.poll() == 1
    assert receiver.loaded_version == -1  # fetched, not loaded: loading is the caller's job
    assert receiver.receive_into(load) is True
    assert loads == [(1, True)] and receiver.loaded_version == 1
    assert len(receiver.latencies_s) == 1 and receiver.latencies_s[0] >= 0
    assert receiver.receive_into(load) is False  # nothing newer
    assert len(receiver.latencies_s) == 1

    store.put(WeightsMessage(2, time.time(), state(2)))
    store.put(WeightsMessage(3, time.time(), state(3)))
    assert receiver.wait_for(3, timeout=WAIT)
    assert receiver.receive_into(load) is True
    assert loads == [(1, True), (3, True)] and receiver.loaded_version == 3
    assert len(receiver.latencies_s) == 2
    assert [s["attrs"]["version"] for s in rec.drain() if s["name"] == "load_weights"] == [1, 3]


def test_receiver_initial_version_skips_older_weights(closers):
    store = WeightStore()
    store.put(WeightsMessage(0, time.time(), state(0)))
    receiver = ObjectStoreReceiver(
        WeightStoreClient(LocalHandle(store)), poll_interval_s=0.01, initial_version=0
    )
    closers.append(receiver)
    assert receiver.wait_for(0, timeout=WAIT)
    assert receiver.receive_into(lambda sd: pytest.fail("v0 is already loaded")) is False
    assert receiver.loaded_version == 0


def test_wait_for_wakes_on_publish_from_another_thread(closers):
    store = WeightStore()
    pub = ObjectStorePublisher(WeightStoreClient(LocalHandle(store)))
    receiver = ObjectStoreReceiver(WeightStoreClient(LocalHandle(store)), poll_interval_s=0.01)
    closers.extend([pub, receiver])
    timer = threading.Timer(0.05, lambda: pub.publish(2, state(2)))
    timer.start()
    assert receiver.wait_for(2, timeout=WAIT)
    timer.join()
    got = {}
    assert receiver.receive_into(got.update)
    assert got["w"].tolist() == [2.0, 2.0, 2.0]


def test_receiver_background_error_surfaces_on_next_call(closers):
    store = WeightStore()
    store.put(WeightsMessage(1, time.time(), state(1)))
    receiver = ObjectStoreReceiver(
        WeightStoreClient(FailingHandle(store, get_fails=True)), poll_interval_s=0.01
    )
    closers.append(receiver)
    with pytest.raises(RuntimeError, match=r"weight receiving failed.*object lost"):
        receiver.wait_for(1, timeout=WAIT)
    with pytest.raises(RuntimeError, match="weight receiving failed"):
        receiver.poll()
    with pytest.raises(RuntimeError, match="weight receiving failed"):
        receiver.receive_into(lambda sd: None)


def test_receiver_close_releases_waiters():
    receiver = ObjectStoreReceiver(
        WeightStoreClient(LocalHandle(WeightStore())), poll_interval_s=0.01
    )
    result = {}
    thread = threading.Thread(target=lambda: result.update(ok=receiver.wait_for(1)))
    thread.start()
    receiver.close()
    thread.join(timeout=WAIT)
    assert not thread.is_alive() and result == {"ok": False}


def test_store_long_poll_returns_when_a_newer_version_arrives():
    store = WeightStore()
    store.put(WeightsMessage(1, 0.0, "p1"))
    assert store.wait_for_newer(0, timeout=0) == 1  # already newer: no wait
    assert store.wait_for_newer(1, timeout=0.01) == 1  # nothing newer: times out
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("v", store.wait_for_newer(1, 30)))
    waiter.start()
    store.put(WeightsMessage(2, 0.0, "p2"))
    waiter.join(timeout=10)
    assert not waiter.is_alive() and got["v"] == 2


def test_factory_builds_object_store_sync_from_the_config(closers):
    sync = load_config(None, []).transport.weight_sync
    assert sync.type == "object_store"
    store = WeightStore()
    pub = build_publisher(sync, WeightStoreClient(LocalHandle(store)))
    receiver = build_receiver(
        sync, WeightStoreClient(LocalHandle(store)), initial_version=0, member="producer-0"
    )
    closers.extend([pub, receiver])
    assert isinstance(pub, ObjectStorePublisher) and isinstance(receiver, ObjectStoreReceiver)
    assert receiver.loaded_version == 0
    pub.publish(1, state(1))
    pub.flush(timeout=WAIT)
    assert receiver.wait_for(1, timeout=WAIT)
    got = {}
    assert receiver.receive_into(got.update) and got["w"].tolist() == [1.0, 1.0, 1.0]


def test_a_small_version_is_announced_before_publish_returns(closers):
    store = WeightStore()
    rec = SpanRecorder("c", "consumer")
    pub = ObjectStorePublisher(
        WeightStoreClient(LocalHandle(store)), rec, send_on_caller_max_bytes=1024
    )
    closers.append(pub)
    weights = state(1)
    pub.publish(1, weights)
    # no flush: the announcement is in the store when publish returns, and it is a copy
    assert store.latest_version() == 1 and pub.sent_version == 1
    assert store.latest().payload["w"].data_ptr() != weights["w"].data_ptr()
    assert [(s["name"], s["thread"], s["attrs"]["version"]) for s in rec.drain()] == [
        ("publish_weights", "main", 1)
    ]


def test_a_version_over_the_limit_goes_to_the_background_thread(closers):
    store = WeightStore()
    handle = GatedHandle(store)
    pub = ObjectStorePublisher(WeightStoreClient(handle), send_on_caller_max_bytes=15)
    closers.append(pub)
    pub.publish(1, state(1, size=3))  # 4 + 12 = 16 bytes > 15: background
    assert store.latest_version() == -1
    handle.gate.set()
    pub.flush(timeout=WAIT)
    pub.publish(2, {"v": torch.tensor(2.0), "w": torch.full((2,), 2.0)})  # 12 bytes: here
    assert store.latest_version() == 2 and handle.put_versions == [1, 2]


def test_a_failed_send_on_the_calling_thread_raises_there_and_stays(closers):
    pub = ObjectStorePublisher(WeightStoreClient(FailingHandle(WeightStore(), put_fails=True)))
    closers.append(pub)
    with pytest.raises(RuntimeError, match=r"weight publishing failed.*object store unreachable"):
        pub.publish(1, state(1))
    with pytest.raises(RuntimeError, match="weight publishing failed"):
        pub.flush(timeout=WAIT)


class CountingStore(WeightStore):
    """Counts the calls a receiver makes per version."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def wait_for_message(self, have, timeout):
        self.calls.append("wait_for_message")
        return super().wait_for_message(have, timeout)

    def wait_for_newer(self, have, timeout):
        self.calls.append("wait_for_newer")
        return super().wait_for_newer(have, timeout)

    def latest(self):
        self.calls.append("latest")
        return super().latest()


def test_receiver_gets_each_version_with_its_long_poll(closers):
    store = CountingStore()
    store.put(WeightsMessage(1, time.time(), state(1)))
    receiver = ObjectStoreReceiver(WeightStoreClient(LocalHandle(store)), poll_interval_s=0.2)
    closers.append(receiver)
    assert receiver.wait_for(1, timeout=WAIT)
    store.put(WeightsMessage(2, time.time(), state(2)))
    assert receiver.wait_for(2, timeout=WAIT)
    # the long poll brings the message: no second call for it
    assert set(store.calls) == {"wait_for_message"}
    got = {}
    assert receiver.receive_into(got.update) and got["w"].tolist() == [2.0, 2.0, 2.0]


def test_store_wait_for_message_returns_the_newer_announcement_or_none():
    store = WeightStore()
    assert store.wait_for_message(-1, timeout=0.01) is None
    store.put(WeightsMessage(1, 0.0, "p1"))
    assert store.wait_for_message(-1, timeout=0).payload == "p1"
    assert store.wait_for_message(1, timeout=0.01) is None
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("m", store.wait_for_message(1, 30)))
    waiter.start()
    store.put(WeightsMessage(2, 0.0, "p2"))
    waiter.join(timeout=10)
    assert not waiter.is_alive() and got["m"].version == 2 and got["m"].payload == "p2"


class RefusingStore(WeightStore):
    def put(self, message):
        raise ConnectionError("weight store gone")


def test_an_announcement_sent_without_waiting_fails_at_the_next_flush(closers):
    pub = ObjectStorePublisher(WeightStoreClient(LocalHandle(RefusingStore())))
    closers.append(pub)
    pub.publish(1, state(1))  # the announcement's answer is not awaited here
    with pytest.raises(RuntimeError, match=r"weight publishing failed.*weight store gone"):
        pub.flush(timeout=WAIT)
    with pytest.raises(RuntimeError, match="weight publishing failed"):
        pub.publish(2, state(2))
