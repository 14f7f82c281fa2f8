"""Two processes and a weight store without Ray, for the CUDA handoff's cross-process tests
(tests/gpu/test_cuda_ipc.py): a :class:`multiprocessing.managers.BaseManager` serves one
:class:`~zbrl.transport.weight_sync.store.WeightStore` (its server runs each client connection on
a thread of its own, so the store's long polls block only their caller), and
:func:`receive_versions` is the receiving process (spawned: CUDA cannot be used after a fork).

Object-store payloads travel by value inside the announcement (no Ray object store here).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from multiprocessing.managers import BaseManager
from typing import Any

import torch

from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.weight_sync.cuda_ipc import CudaIpcPublisher
from zbrl.transport.weight_sync.store import WeightStore


class StoreManager(BaseManager):
    """Serves ``WeightStore()`` instances to other processes."""


StoreManager.register("WeightStore", WeightStore)


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value


class ManagerHandle:
    """A :class:`~zbrl.transport.handles.Handle` over a manager proxy of a WeightStore."""

    def __init__(self, proxy: Any) -> None:
        self.proxy = proxy

    def call(self, method: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        return getattr(self.proxy, method.__name__)(*args)

    def send(self, method: Callable[..., Any], *args: Any) -> _Done:
        return _Done(self.call(method, *args))

    def put_object(self, value: Any) -> Any:
        return value

    def get_object(self, payload: Any, timeout: float | None = None) -> Any:
        return payload


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's bytes (plain bytes cross a queue after the sending process has exited)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def receive_versions(
    store_proxy: Any,
    shapes: dict[str, tuple[int, ...]],
    dtype: str,
    device: str,
    last_version: int,
    load_delay_s: float,
    results: Any,
) -> None:
    """The receiving process: a :class:`CudaIpcReceiver` named ``producer-0`` loads versions into
    tensors of ``shapes`` (``dtype`` on ``device``) until ``last_version``; after each load it
    puts ``(version, {name: raw_bytes(loaded tensor)})`` on ``results``, and at the end
    ``("done", route kind, route reason)`` (or ``("error", text)``)."""
    from zbrl.transport.weight_sync.cuda_ipc import CudaIpcReceiver

    receiver = None
    try:
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        model = {
            k: torch.empty(s, dtype=getattr(torch, dtype), device=device) for k, s in shapes.items()
        }
        client = WeightStoreClient(ManagerHandle(store_proxy))
        receiver = CudaIpcReceiver(client, "producer-0", poll_interval_s=0.05, initial_version=0)

        def load(tensors: dict[str, torch.Tensor]) -> None:
            for name, target in model.items():
                target.copy_(tensors[name])
            time.sleep(load_delay_s)  # a slow load: the publisher goes on meanwhile

        while receiver.loaded_version < last_version:
            if not receiver.wait_for(receiver.loaded_version + 1, timeout=60):
                raise TimeoutError(f"no version after {receiver.loaded_version} within 60 s")
            if receiver.receive_into(load):
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                results.put((receiver.loaded_version, {k: raw_bytes(v) for k, v in model.items()}))
        route = receiver.route
        results.put(("done", route.kind if route else None, route.reason if route else ""))
    except BaseException as exc:
        results.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        if receiver is not None:
            receiver.close()


# --- the publishing side of the cross-process tests ---------------------------------------

SHAPES = {  # a small Qwen2-like decoder: embedding, 2 layers, norms (about 9 MB in float32)
    "model.embed_tokens.weight": (1024, 256),
    **{
        f"model.layers.{i}.{name}": shape
        for i in range(2)
        for name, shape in {
            "self_attn.q_proj.weight": (256, 256),
            "self_attn.q_proj.bias": (256,),
            "self_attn.k_proj.weight": (64, 256),
            "self_attn.v_proj.weight": (64, 256),
            "self_attn.o_proj.weight": (256, 256),
            "mlp.gate_proj.weight": (704, 256),
            "mlp.up_proj.weight": (704, 256),
            "mlp.down_proj.weight": (256, 704),
            "input_layernorm.weight": (256,),
        }.items()
    },
    "model.norm.weight": (256,),
}
BUCKET_BYTES = 2**20  # several buckets per version (the embedding gets one of its own)
TIMEOUT = 120.0


def master(version: int, device: str) -> dict[str, torch.Tensor]:
    """Float32 weights that differ in every element from one version to the next."""
    g = torch.Generator().manual_seed(0)
    return {k: (torch.randn(s, generator=g) + 0.01 * version).to(device) for k, s in SHAPES.items()}


def expected_bytes(version: int) -> dict[str, bytes]:
    """What a receiver loads of :func:`master`'s ``version`` in bfloat16, by name."""
    return {k: raw_bytes(v.to(torch.bfloat16)) for k, v in master(version, "cpu").items()}


def hand_off(
    device: str, versions: int, load_delay_s: float
) -> tuple[list[tuple[int, dict[str, bytes]]], tuple[str, str | None, str], CudaIpcPublisher]:
    """Publish versions 1..``versions`` of :func:`master` on ``device`` (cast to bfloat16) as
    fast as the publisher allows, to a spawned :func:`receive_versions` that loads each one it
    takes in ``load_delay_s`` seconds or more. Returns what it loaded (``(version, bytes by
    name)``, in order), its final ``("done", route kind, reason)`` and the (closed) publisher."""
    ctx = torch.multiprocessing.get_context("spawn")
    manager = StoreManager(ctx=ctx)
    manager.start()
    results = ctx.Queue()
    child = None
    pub = None
    try:
        store_proxy = manager.WeightStore()
        client = WeightStoreClient(ManagerHandle(store_proxy))
        args = (store_proxy, SHAPES, "bfloat16", device, versions, load_delay_s, results)
        child = ctx.Process(target=receive_versions, args=args, daemon=True)
        child.start()
        pub = CudaIpcPublisher(client, dtype=torch.bfloat16, bucket_bytes=BUCKET_BYTES)
        _wait_registered(client, child)
        weights = [master(v, device) for v in range(1, versions + 1)]
        for version, state in enumerate(weights, start=1):
            pub.publish(version, state)
        pub.flush(timeout=TIMEOUT)
        loaded, done = [], None
        while done is None:
            try:
                item = results.get(timeout=TIMEOUT)
            except queue.Empty:
                raise TimeoutError(
                    "the receiving process sent nothing within the timeout"
                ) from None
            if item[0] == "error":
                raise RuntimeError(f"the receiving process failed: {item[1]}")
            if item[0] == "done":
                done = item
            else:
                loaded.append(item)
        return loaded, done, pub
    finally:
        if pub is not None:
            pub.close()
        if child is not None:
            child.join(30)
            if child.is_alive():
                child.kill()
        manager.shutdown()


def _wait_registered(client: WeightStoreClient, child: Any) -> None:
    """Until the receiver has registered (so the first version is routed for it)."""
    deadline = time.monotonic() + TIMEOUT
    while "producer-0" not in client.receivers():
        if not child.is_alive() or time.monotonic() > deadline:
            raise TimeoutError("the receiving process never registered")
        time.sleep(0.05)


def check_loaded(loaded: list[tuple[int, dict[str, bytes]]], last: int) -> list[int]:
    """The versions :func:`hand_off` loaded, after checking that they only go up, end with
    ``last``, and each equals the published version (cast to bfloat16) bit for bit; an
    AssertionError names the first difference."""
    versions = [version for version, _ in loaded]
    if not versions or versions != sorted(set(versions)) or versions[-1] != last:
        raise AssertionError(f"loaded versions {versions}, expected increasing up to {last}")
    for version, got in loaded:
        want = expected_bytes(version)
        bad = [name for name in want if got[name] != want[name]]
        if bad:
            raise AssertionError(f"version {version}: {len(bad)} tensors differ, e.g. {bad[0]}")
    return versions
