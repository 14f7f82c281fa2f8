"""The CUDA weight handoff (``transport.weight_sync.type=cuda_ipc``) without CUDA: bucket plans,
routes, and the publisher/receiver protocol (holds, double buffering, versions, fallbacks) over an
in-process store with :class:`LocalSharer` standing in for IPC handles and fake endpoints standing
in for GPUs. tests/gpu/test_cuda_ipc.py runs the same protocol across processes on a GPU."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time

import pytest
import torch

from zbrl.config import load_config
from zbrl.config.loader import ConfigError
from zbrl.config.transport import CudaIpcSync
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.buckets import ALIGN, flatten_into, plan_buckets, unflatten
from zbrl.transport.weight_sync.cuda_ipc import CudaIpcPublisher, CudaIpcReceiver, Handoff
from zbrl.transport.weight_sync.factory import build_publisher, build_receiver
from zbrl.transport.weight_sync.ipc_handles import LocalSharer
from zbrl.transport.weight_sync.routes import Endpoint, choose_route, local_endpoint
from zbrl.transport.weight_sync.store import WeightStore
from zbrl.types import WeightsMessage

WAIT = 10.0  # upper bound of waits on background threads (never reached when passing)
HOST = "node-a/boot-1"
GPU = "GPU-aaaa"


def weights(version: float, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Three tensors whose values encode the version (a torn load shows mixed values)."""
    return {
        "embed": torch.full((16, 8), version, dtype=dtype),
        "layer.w": torch.full((8, 8), version + 0.5, dtype=dtype),
        "step": torch.tensor([int(version)], dtype=torch.int64),
    }


def source_at(gpu: str | None = GPU, host: str = HOST):
    return lambda device: Endpoint(host, (gpu,) if gpu else (), gpu, os.getppid())  # another pid


def sink(gpus=(GPU,), host: str = HOST, pid: int | None = None) -> Endpoint:
    return Endpoint(host, tuple(gpus), None, os.getpid() if pid is None else pid)


class CountingHandle(LocalHandle):
    """Counts object-store puts."""

    def __init__(self, target):
        super().__init__(target)
        self.puts = 0

    def put_object(self, value):
        self.puts += 1
        return value


@pytest.fixture
def rig():
    """A store, a sharer, and the publishers/receivers a test made (closed afterwards)."""

    class Rig:
        def __init__(self):
            self.store = WeightStore()
            self.handle = CountingHandle(self.store)
            self.client = WeightStoreClient(self.handle)
            self.sharer = LocalSharer()
            self.items = []

        def publisher(self, gpu=GPU, **kw):
            kw.setdefault("bucket_bytes", 600)
            pub = CudaIpcPublisher(
                self.client,
                dtype=kw.pop("dtype", None),
                sharer=self.sharer,
                endpoint=source_at(gpu),
                **kw,
            )
            self.items.append(pub)
            return pub

        def receiver(self, member="producer-0", endpoint=None, **kw):
            rec = CudaIpcReceiver(
                self.client,
                member,
                sharer=kw.pop("sharer", self.sharer),
                endpoint=endpoint or sink(),
                poll_interval_s=0.05,
                initial_version=0,
                **kw,
            )
            self.items.append(rec)
            return rec

    r = Rig()
    yield r
    for item in reversed(r.items):
        item.close()


def loaded_copy(into: dict):
    def load(tensors):
        into.clear()
        into.update({k: v.clone() for k, v in tensors.items()})

    return load


# --- bucket plans -------------------------------------------------------------------------------


def test_plan_buckets_keeps_tensors_whole_in_order_and_under_the_bucket_size():
    tensors = {f"t{i}": torch.zeros(n) for i, n in enumerate([10, 100, 30, 300, 5, 5])}  # f32
    layouts = plan_buckets(tensors, bucket_bytes=512)
    names = [[s.name for s in layout.slots] for layout in layouts]
    # 40->64 B, 400->448 (together 512), 120->128, 1200 alone (larger than a bucket), 2x64
    assert names == [["t0", "t1"], ["t2"], ["t3"], ["t4", "t5"]]
    for layout in layouts:
        assert layout.total_bytes <= 512 or len(layout.slots) == 1
        assert all(s.offset % ALIGN == 0 for s in layout.slots)
        assert layout.buckets() == [(0, layout.total_bytes)]


def test_bucket_round_trip_casts_floats_and_keeps_integers_exact():
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(7, 5, generator=g),
        "ids": torch.arange(9, dtype=torch.int64) * 1_000_003,
        "b": torch.randn(33, generator=g),
    }
    layouts = plan_buckets(tensors, bucket_bytes=128, dtype=torch.bfloat16)
    out = {}
    for layout in layouts:
        flat = torch.empty(layout.total_bytes, dtype=torch.uint8)
        flatten_into(tensors, layout, flat)
        out.update(unflatten(flat, layout))
    assert list(out) == ["a", "ids", "b"]
    assert out["a"].dtype == torch.bfloat16 and torch.equal(out["a"], tensors["a"].bfloat16())
    assert out["ids"].dtype == torch.int64 and torch.equal(out["ids"], tensors["ids"])
    assert torch.equal(out["b"], tensors["b"].bfloat16())
    # bf16 slots: 70 and 66 bytes, int64: 72; each padded to 128, one per 128-byte bucket
    assert [[(x.name, x.nbytes) for x in lay.slots] for lay in layouts] == [
        [("a", 70)],
        [("ids", 72)],
        [("b", 66)],
    ]


def test_plan_buckets_refuses_a_non_positive_bucket():
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        plan_buckets({"a": torch.zeros(1)}, 0)


# --- routes -------------------------------------------------------------------------------------


def test_routes_pick_ipc_only_when_the_receiver_sees_the_consumer_gpu():
    src = Endpoint(HOST, ("GPU-x", GPU), GPU, 1)
    same_gpu = choose_route(src, sink((GPU,)), "producer-0")
    assert same_gpu.kind == "cuda_ipc" and same_gpu.device_index == 0
    assert "same GPU" in same_gpu.reason
    # a process that sees several GPUs numbers the consumer's by its own order
    node = choose_route(src, sink(("GPU-y", "GPU-z", GPU)), "producer-1")
    assert node.kind == "cuda_ipc" and node.device_index == 2

    cases = {
        "not on a CUDA device": (Endpoint(HOST, (), None, 1), sink()),
        "runs on another machine (node-b": (src, sink(host="node-b/boot-9")),
        "sees no CUDA device": (src, sink(())),
        "runs in the consumer's own process": (src, sink(pid=1)),
        f"GPU {GPU} is not visible in producer-0's process (it sees GPU-y)": (
            src,
            sink(("GPU-y",)),
        ),
    }
    for reason, (a, b) in cases.items():
        route = choose_route(a, b, "producer-0")
        assert route.kind == "object_store" and reason in route.reason, route.reason
    assert "launch.producer_num_gpus" in choose_route(src, sink(("GPU-y",)), "p").reason


def test_local_endpoint_without_cuda_has_no_gpu():
    here = local_endpoint(torch.device("cpu"))
    assert here.gpu is None and here.pid == os.getpid()
    assert here.host == local_endpoint().host  # stable within the machine
    if not torch.cuda.is_available():
        assert here.gpus == ()


def test_store_holds_are_atomic_with_taking_the_announcement_and_end_on_reregistration():
    store = WeightStore()
    store.register_receiver("producer-0", sink())
    assert store.acquire_newer("producer-0", -1, 0.0) is None  # nothing announced: no hold
    store.put(WeightsMessage(1, 0.0, "v1"))
    assert store.acquire_newer("producer-0", -1, 0.0).payload == "v1"
    assert store.acquire_newer("producer-0", 1, 0.0) is None  # not newer than what it has
    assert store.holders() == {1: ["producer-0"]}
    store.register_receiver("producer-0", sink(gpus=()), keep_holds=True)  # endpoint change
    assert store.holders() == {1: ["producer-0"]}
    store.register_receiver("producer-0", sink())  # a restart
    assert store.holders() == {}


# --- the protocol over LocalSharer --------------------------------------------------------------


def test_same_gpu_receiver_loads_views_of_the_shared_buffers_without_the_object_store(rig, capsys):
    pub = rig.publisher(dtype=torch.bfloat16, bucket_bytes=300)
    rec = rig.receiver()
    got = {}
    for version in (1, 2, 3):
        pub.publish(version, weights(version))
        assert rec.wait_for(version, timeout=WAIT)
        assert rec.receive_into(loaded_copy(got))
        expected = weights(version)
        assert got["embed"].dtype == torch.bfloat16 and got["step"].dtype == torch.int64
        for name, tensor in expected.items():
            want = tensor.bfloat16() if tensor.is_floating_point() else tensor
            assert torch.equal(got[name], want), (version, name)
    assert rec.loaded_version == 3 and len(rec.latencies_s) == 3
    assert not rec.receive_into(loaded_copy(got))  # nothing newer
    assert rig.handle.puts == 0  # no object-store copy: no receiver needs one
    message = rig.store.latest()
    assert isinstance(message.payload, Handoff) and message.payload.fallback is None
    assert len(pickle.dumps(message)) < 2000  # handles and layouts only, never the tensors
    assert len(message.payload.buckets) == 2  # bf16 16x8 (256 B) | 8x8 (128 B) + int64 (64 B)
    assert rec.route.kind == "cuda_ipc"
    assert pub.buffer_sets == 2
    assert rig.sharer.opened == 4  # two sets of two buffers, each mapped once
    pub.close()
    assert pub.buffer_sets == 0 and pub.peak_buffer_sets == 2  # close drops them; the peak stays
    assert rig.store.holders() == {}  # every loaded version released
    assert (
        "producer-0 receives over CUDA IPC: producer-0 shares the same GPU"
        in capsys.readouterr().out
    )


def test_loads_hand_over_views_not_copies(rig):
    pub = rig.publisher()
    rec = rig.receiver()
    pub.publish(1, weights(1))
    assert rec.wait_for(1, timeout=WAIT)
    seen = {}
    rec.receive_into(lambda tensors: seen.update(tensors))
    buffers = {id(t.untyped_storage()) for s in pub._sets for t in s.buffers}
    storages = {t.untyped_storage().data_ptr() for s in pub._sets for t in s.buffers}
    assert buffers and all(t.untyped_storage().data_ptr() in storages for t in seen.values())


def test_two_buffer_sets_rotate_as_the_receiver_moves_on(rig):
    pub = rig.publisher()
    rec = rig.receiver()
    for version in range(1, 7):  # the receiver sees every version but loads none until the end
        pub.publish(version, weights(version))
        assert rec.wait_for(version, timeout=WAIT)
        deadline = time.monotonic() + WAIT
        while set(rig.store.holders()) != {version} and time.monotonic() < deadline:
            time.sleep(0.005)  # the receiver's thread lets go of the superseded version
        assert set(rig.store.holders()) == {version}
    assert pub.buffer_sets == 2 and pub.waited_s < 1.0
    got = {}
    assert rec.receive_into(loaded_copy(got))
    assert rec.loaded_version == 6 and torch.equal(got["embed"], weights(6)["embed"])


def test_a_set_being_loaded_is_never_rewritten_publish_waits_for_it(rig):
    pub = rig.publisher()
    rec = rig.receiver()
    pub.publish(1, weights(1))
    assert rec.wait_for(1, timeout=WAIT)
    entered, go, got = threading.Event(), threading.Event(), {}

    def slow_load(tensors):
        entered.set()
        assert go.wait(WAIT)
        got.update({k: v.clone() for k, v in tensors.items()})

    loader = threading.Thread(target=rec.receive_into, args=(slow_load,))
    loader.start()
    assert entered.wait(WAIT)
    pub.publish(2, weights(2))  # the second set
    assert rec.wait_for(2, timeout=WAIT)
    third = threading.Thread(target=pub.publish, args=(3, weights(3)))
    third.start()  # set 1 is being loaded, set 2 announced: no set is free
    third.join(0.3)
    assert third.is_alive()
    go.set()
    loader.join(WAIT)
    third.join(WAIT)
    assert not third.is_alive()
    assert torch.equal(got["embed"], weights(1)["embed"])  # read whole, before v3 overwrote it
    assert rec.wait_for(3, timeout=WAIT)
    assert rec.receive_into(loaded_copy(got)) and torch.equal(got["layer.w"], weights(3)["layer.w"])
    assert pub.waited_s > 0.2


def test_failed_load_keeps_the_hold_until_a_newer_version_supersedes_it(rig):
    pub = rig.publisher()
    rec = rig.receiver()
    pub.publish(1, weights(1))
    assert rec.wait_for(1, timeout=WAIT)

    def failing(tensors):
        raise KeyError("no such parameter")

    with pytest.raises(KeyError):
        rec.receive_into(failing)
    assert rig.store.holders() == {1: ["producer-0"]}  # a retry reads an intact version
    assert rec.loaded_version == 0
    pub.publish(2, weights(2))
    assert rec.wait_for(2, timeout=WAIT)
    got = {}
    assert rec.receive_into(loaded_copy(got)) and torch.equal(got["embed"], weights(2)["embed"])
    assert rig.store.holders() == {}


def test_a_receiver_stuck_in_a_load_fails_publish_naming_it(rig):
    pub = rig.publisher(release_timeout_s=0.2)
    rec = rig.receiver()
    pub.publish(1, weights(1))
    assert rec.wait_for(1, timeout=WAIT)
    entered, go = threading.Event(), threading.Event()

    def stuck(tensors):
        entered.set()
        assert go.wait(WAIT)

    loader = threading.Thread(target=rec.receive_into, args=(stuck,))
    loader.start()
    try:
        assert entered.wait(WAIT)
        pub.publish(2, weights(2))
        assert rec.wait_for(2, timeout=WAIT)
        with pytest.raises(
            RuntimeError,
            match=r"held after transport.weight_sync.release_timeout_s=0.2s by producer-0 "
            r"\(version 1\).*Raise transport.weight_sync.buffers",
        ):
            pub.publish(3, weights(3))
    finally:
        go.set()
        loader.join(WAIT)


def test_holds_of_a_receiver_whose_process_is_gone_are_dropped(rig):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    pub = rig.publisher(release_timeout_s=WAIT)
    rec = rig.receiver(endpoint=sink(pid=dead_pid))
    pub.publish(1, weights(1))
    assert rec.wait_for(1, timeout=WAIT)
    rec.close()  # stands in for the dead process: stop without unregistering
    rig.store.register_receiver("producer-0", sink(pid=dead_pid))
    rig.store.acquire_newer("producer-0", 0, 0.0)  # holds v1 again
    pub.publish(2, weights(2))
    pub.flush(timeout=WAIT)  # v2 announced: its set is not free either
    start = time.monotonic()
    pub.publish(3, weights(3))  # would need v1's set: its holder is dead
    assert time.monotonic() - start < 2.0
    assert 1 not in rig.store.holders()


class GatedAnnounce(CountingHandle):
    """Blocks the publisher's announcement (``WeightStore.put``) until the test opens the gate."""

    def __init__(self, target):
        super().__init__(target)
        self.gate, self.entered = threading.Event(), threading.Event()

    def call(self, method, *args, timeout=None):
        if method is WeightStore.put:
            self.entered.set()
            assert self.gate.wait(WAIT), "test never opened the gate"
        return super().call(method, *args, timeout=timeout)


def test_a_version_superseded_before_it_was_announced_gives_its_set_to_the_next(rig):
    handle = GatedAnnounce(rig.store)
    pub = CudaIpcPublisher(
        WeightStoreClient(handle), sharer=rig.sharer, endpoint=source_at(), bucket_bytes=600
    )
    rig.items.append(pub)
    rec = rig.receiver()
    pub.publish(1, weights(1))
    assert handle.entered.wait(WAIT)  # v1's set is being announced (busy)
    pub.publish(2, weights(2))  # a second set, pending
    pub.publish(3, weights(3))  # no third set: v2, never announced, gives up its set
    assert pub.buffer_sets == 2 and pub.waited_s < 1.0
    handle.gate.set()
    pub.flush(timeout=WAIT)
    assert rig.store.latest_version() == 3
    assert rec.wait_for(3, timeout=WAIT)
    got = {}
    assert rec.receive_into(loaded_copy(got)) and torch.equal(got["layer.w"], weights(3)["layer.w"])


def test_weights_that_change_shape_get_new_buffers(rig):
    pub = rig.publisher()
    rec = rig.receiver()
    pub.publish(1, weights(1))
    assert rec.wait_for(1, timeout=WAIT)
    bigger = {**weights(2), "head": torch.full((4, 8), 9.0)}
    pub.publish(2, bigger)
    assert rec.wait_for(2, timeout=WAIT)
    got = {}
    assert rec.receive_into(loaded_copy(got))
    assert set(got) == set(bigger) and all(torch.equal(got[k], bigger[k]) for k in bigger)
    assert pub.buffer_sets == 1  # the old layout's sets were dropped


def test_receiver_on_another_machine_gets_the_object_store_copy_with_one_log_line(rig, capsys):
    pub = rig.publisher(dtype=torch.bfloat16)
    near = rig.receiver("producer-0")
    far = rig.receiver("producer-1", endpoint=sink(host="node-b/boot-2"))
    for version in (1, 2):
        pub.publish(version, weights(version))
        for rec in (near, far):
            assert rec.wait_for(version, timeout=WAIT)
    near_got, far_got = {}, {}
    assert near.receive_into(loaded_copy(near_got)) and far.receive_into(loaded_copy(far_got))
    for name in near_got:
        assert torch.equal(near_got[name], far_got[name])
    assert far_got["embed"].dtype == torch.bfloat16
    assert rig.handle.puts == 2  # one object-store copy per version, for producer-1 only
    assert near.route.kind == "cuda_ipc" and far.route.kind == "object_store"
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "producer-1" in ln]
    assert lines == [
        "[zbrl] weight sync: producer-1 receives over the object store: producer-1 runs on "
        "another machine (node-b, the consumer on node-a); CUDA IPC works within one machine"
    ]


def test_weights_off_the_gpu_go_through_the_object_store(rig, capsys):
    pub = rig.publisher(gpu=None)  # e.g. a CPU consumer
    rec = rig.receiver()
    pub.publish(1, weights(1))
    assert rec.wait_for(1, timeout=WAIT)
    got = {}
    assert rec.receive_into(loaded_copy(got)) and torch.equal(got["embed"], weights(1)["embed"])
    assert pub.buffer_sets == 0 and rig.handle.puts == 1
    assert rig.store.latest().payload.buckets is None
    assert "receives over the object store: the consumer's weights are not on a CUDA device" in (
        capsys.readouterr().out
    )


def test_a_receiver_registered_after_a_version_takes_the_next_one(rig, capsys):
    pub = rig.publisher()
    near = rig.receiver("producer-0")
    pub.publish(1, weights(1))
    pub.flush(timeout=WAIT)
    late = rig.receiver("evaluator", endpoint=sink(gpus=()))  # no GPU: needs the object store
    assert not late.wait_for(1, timeout=0.3)  # v1 carried no object-store copy
    pub.publish(2, weights(2))
    assert late.wait_for(2, timeout=WAIT)
    got = {}
    assert late.receive_into(loaded_copy(got)) and torch.equal(got["embed"], weights(2)["embed"])
    assert "evaluator registered after version 1" in capsys.readouterr().out
    assert near.wait_for(2, timeout=WAIT)


def test_a_receiver_that_cannot_map_the_buffers_falls_back(rig, capsys):
    class Broken(LocalSharer):
        def open(self, handle, device_index):
            raise RuntimeError("CUDA error: invalid device context")

    pub = rig.publisher()
    rec = rig.receiver(sharer=Broken())
    pub.publish(1, weights(1))
    deadline = time.monotonic() + WAIT
    while rig.store.receivers()["producer-0"].gpus and time.monotonic() < deadline:
        time.sleep(0.005)
    pub.publish(2, weights(2))
    assert rec.wait_for(2, timeout=WAIT)
    got = {}
    assert rec.receive_into(loaded_copy(got)) and torch.equal(got["embed"], weights(2)["embed"])
    assert rec.route.kind == "object_store"
    assert "mapping the consumer's CUDA buffers failed (CUDA error" in capsys.readouterr().out


def test_versions_only_go_up_and_close_unregisters(rig):
    pub = rig.publisher()
    rec = rig.receiver()
    pub.publish(5, weights(5))
    pub.flush(timeout=WAIT)
    pub.publish(3, weights(3))  # older: the store keeps 5
    pub.flush(timeout=WAIT)
    assert rig.store.latest_version() == 5
    assert rec.wait_for(5, timeout=WAIT) and rec.poll() == 5
    got = {}
    assert rec.receive_into(loaded_copy(got)) and got["step"].item() == 5
    rec.close()
    assert rig.store.receivers() == {} and rig.store.holders() == {}


# --- config and factory -------------------------------------------------------------------------


def test_config_accepts_cuda_ipc_and_names_bad_fields():
    cfg = load_config(None, ["transport.weight_sync=cuda_ipc"])
    sync = cfg.transport.weight_sync
    assert isinstance(sync, CudaIpcSync)
    assert (sync.bucket_mb, sync.buffers, sync.release_timeout_s) == (256.0, 2, 120.0)
    with pytest.raises(
        ConfigError,
        match=r"field 'transport.weight_sync.buffers' = 1: .*fix: use a value of at least 2",
    ):
        load_config(
            None, ["transport.weight_sync.type=cuda_ipc", "transport.weight_sync.buffers=1"]
        )
    with pytest.raises(
        ConfigError, match=r"transport.weight_sync.backend.: unknown field.*type cuda_ipc"
    ):
        load_config(
            None, ["transport.weight_sync.type=cuda_ipc", "transport.weight_sync.backend=nccl"]
        )


def test_factory_builds_the_handoff_and_publisher_refuses_one_buffer_set():
    store = WeightStoreClient(LocalHandle(WeightStore()))
    sync = CudaIpcSync(bucket_mb=1, buffers=3)
    pub = build_publisher(sync, store)
    rec = build_receiver(sync, store, initial_version=0, member="producer-0")
    try:
        assert isinstance(pub, CudaIpcPublisher) and pub._bucket_bytes == 2**20
        assert pub._max_sets == 3
        assert isinstance(rec, CudaIpcReceiver) and "producer-0" in store.receivers()
    finally:
        rec.close()
        pub.close()
    with pytest.raises(ValueError, match="buffers must be >= 2"):
        CudaIpcPublisher(store, buffers=1)
