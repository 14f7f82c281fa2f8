"""Same-GPU weight handoff: seconds from ``publish`` to loaded in a producer that shares the
consumer's GPU, through CUDA IPC (``transport.weight_sync.type=cuda_ipc``) against the Ray object
store (the default), for the 0.36B Qwen2-shaped model of issue 24 in bfloat16.

This process plays the consumer: float32 master weights on ``cuda:0``, published cast to bfloat16
by the path's publisher (built by the run's own factory). One Ray actor plays the producer, on the
same GPU (``num_gpus=0.5``, as ``launch.producer_num_gpus=0.5 launch.consumer_num_gpus=0.5``
place it): the path's receiver, and a load that copies into preallocated bfloat16 tensors on its
GPU (what ``load_weights`` does). Each path: two warm-up versions (the two buffer sets allocated
and mapped), then ``--repeats`` timed versions; per version the seconds from the start of
``publish`` to the end of the load (synchronised), the part the training thread spends in
``publish`` and the load.
The ``memcpy floor`` row is one cast-copy of the master into bfloat16 on the GPU: no handoff can
cost less. Medians are printed as a table and written to ``--out``.json.

Shape (``--layers``, ``--hidden``, ...): Qwen2 with 24 layers, hidden 896, MLP 4864, 14 heads, 2
KV heads, q/k/v biases, tied embedding over a 4096-token vocabulary: 0.36B parameters, 0.72 GB in
bfloat16 (the model measured on an H100: 1.86 s per version through the object store in a run).

Without CUDA there is nothing to hand off: the script says so and exits 0, unless ``--cpu-check``
runs both paths on CPU at a small size (both then take the object store: a check of the script).
Exit status 2 when, on a GPU, the ``cuda ipc`` path fell back to the object store (the route line
says why), 3 when the paths loaded different weights.

Usage (on a GPU machine; see bench/gpu_handoff.sh)::

    python bench/weight_handoff.py                      # ~1 min on one H100
    python bench/weight_handoff.py --cpu-check          # without a GPU: does the script run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

PATHS = ("object store", "cuda ipc")
WARMUP = 2
"""Untimed versions per path: with two buffer sets, the first two versions allocate and map one
each."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed versions per path")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--bucket-mb", type=float, default=256.0, help="cuda_ipc bucket (MiB)")
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset")
    p.add_argument("--cpu-check", action="store_true", help="without CUDA: a small run on CPU")
    p.add_argument("--out", default="weight_handoff", help="prefix of the .json written")
    return p.parse_args(argv)


def qwen2_shapes(a: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a Qwen2 decoder with a tied embedding, in state-dict order."""
    h, kv = a.hidden, a.hidden // a.heads * a.kv_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (a.vocab, h)}
    for i in range(a.layers):
        pre = f"model.layers.{i}."
        shapes |= {
            pre + "self_attn.q_proj.weight": (h, h),
            pre + "self_attn.q_proj.bias": (h,),
            pre + "self_attn.k_proj.weight": (kv, h),
            pre + "self_attn.k_proj.bias": (kv,),
            pre + "self_attn.v_proj.weight": (kv, h),
            pre + "self_attn.v_proj.bias": (kv,),
            pre + "self_attn.o_proj.weight": (h, h),
            pre + "mlp.gate_proj.weight": (a.intermediate, h),
            pre + "mlp.up_proj.weight": (a.intermediate, h),
            pre + "mlp.down_proj.weight": (h, a.intermediate),
            pre + "input_layernorm.weight": (h,),
            pre + "post_attention_layernorm.weight": (h,),
        }
    shapes["model.norm.weight"] = (h,)
    return shapes


def small(a: argparse.Namespace) -> argparse.Namespace:
    """The ``--cpu-check`` size: 2 layers, hidden 128."""
    return argparse.Namespace(
        **{
            **vars(a),
            "layers": 2,
            "hidden": 128,
            "intermediate": 384,
            "heads": 4,
            "kv_heads": 2,
            "vocab": 512,
            "repeats": min(a.repeats, 2),
        }
    )


def sync_config(path: str, bucket_mb: float) -> Any:
    from zbrl.config.transport import CudaIpcSync, ObjectStoreSync

    return CudaIpcSync(bucket_mb=bucket_mb) if path == "cuda ipc" else ObjectStoreSync()


class Producer:
    """A Ray actor on the consumer's GPU: the path's receiver and a load into bf16 tensors."""

    def __init__(self, sync: Any, shapes: dict, device: str, store: Any) -> None:
        from zbrl.transport.clients import WeightStoreClient
        from zbrl.transport.handles import RayHandle
        from zbrl.transport.weight_sync.factory import build_receiver

        torch.set_num_threads(1)
        self.device = device
        self.model = {
            k: torch.zeros(s, dtype=torch.bfloat16, device=device) for k, s in shapes.items()
        }
        client = WeightStoreClient(RayHandle(store))
        self.receiver = build_receiver(sync, client, initial_version=0, member="producer-0")

    def where(self) -> dict[str, Any]:
        route = getattr(self.receiver, "route", None)
        return {
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "route": None if route is None else f"{route.kind}: {route.reason}",
        }

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, target in self.model.items():
            target.copy_(tensors[name], non_blocking=True)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def take(self, version: int, timeout: float) -> tuple[float, float]:
        """Wait for ``version`` and load it: (loaded at, load seconds)."""
        if not self.receiver.wait_for(version, timeout=timeout):
            raise TimeoutError(f"version {version} did not arrive within {timeout}s")
        start = time.time()
        if not self.receiver.receive_into(self.load):
            raise RuntimeError(f"version {version} was not newer than the loaded one")
        end = time.time()
        return end, end - start

    def checksum(self) -> float:
        return float(sum(t.float().sum().item() for t in self.model.values()))

    def close(self) -> None:
        self.receiver.close()


def memcpy_floor(master: dict[str, torch.Tensor], repeats: int) -> float:
    """Median seconds of one cast-copy of ``master`` into bfloat16 tensors on its device."""
    out = {k: torch.empty_like(v, dtype=torch.bfloat16) for k, v in master.items()}
    times = []
    for _ in range(repeats + 1):
        _sync(master)
        start = time.perf_counter()
        for k, v in master.items():
            out[k].copy_(v)
        _sync(master)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _sync(tensors: dict[str, torch.Tensor]) -> None:
    if next(iter(tensors.values())).is_cuda:
        torch.cuda.synchronize()


def run_path(path: str, a: argparse.Namespace, master: dict, device: str) -> dict[str, Any]:
    import ray

    from zbrl.transport.clients import WeightStoreClient
    from zbrl.transport.handles import RayHandle
    from zbrl.transport.weight_sync.factory import build_publisher
    from zbrl.transport.weight_sync.store import WeightStore

    sync = sync_config(path, a.bucket_mb)
    store = ray.remote(WeightStore).options(num_cpus=0, max_concurrency=64).remote()
    gpus = 0.5 if device.startswith("cuda") else 0
    shapes = {k: tuple(v.shape) for k, v in master.items()}
    producer = (
        ray.remote(Producer)
        .options(num_cpus=0.5, num_gpus=gpus)
        .remote(sync, shapes, "cuda:0" if gpus else "cpu", store)
    )
    ray.get(producer.__ray_ready__.remote(), timeout=300)
    publisher = build_publisher(sync, WeightStoreClient(RayHandle(store)), dtype=torch.bfloat16)
    rows = []
    try:
        for version in range(1, a.repeats + WARMUP + 1):
            pending = producer.take.remote(version, 300.0)
            time.sleep(0.3)  # the producer is waiting, as it would between generation batches
            _sync(master)
            start = time.time()
            publisher.publish(version, master)
            published = time.time() - start
            loaded_at, load_s = ray.get(pending, timeout=330)
            rows.append((loaded_at - start, published, load_s))
        where = ray.get(producer.where.remote(), timeout=60)
        checksum = ray.get(producer.checksum.remote(), timeout=120)
    finally:
        publisher.close()
        ray.get(producer.close.remote(), timeout=60)
        ray.kill(producer)
        ray.kill(store)
    timed = rows[WARMUP:]
    return {
        "path": path,
        "handoff_s": statistics.median(r[0] for r in timed),
        "handoff_min_s": min(r[0] for r in timed),
        "publish_s": statistics.median(r[1] for r in timed),
        "load_s": statistics.median(r[2] for r in timed),
        "warmup_s": [r[0] for r in rows[:WARMUP]],
        "checksum": checksum,
        **where,
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not a.cpu_check:
        print(
            "no CUDA device here: the same-GPU handoff has nothing to measure (every receiver "
            "would take the object store). Run on a GPU machine, or --cpu-check to run the "
            "script on CPU at a small size."
        )
        return 0
    if importlib.util.find_spec("ray") is None:
        print("ray is not installed: the object-store path and the producer actor need it")
        return 1
    from zbrl.launch.ray_setup import start_local_ray

    if not cuda:
        a = small(a)
    device = "cuda:0" if cuda else "cpu"
    shapes = qwen2_shapes(a)
    g = torch.Generator().manual_seed(0)
    master = {k: torch.randn(s, generator=g).to(device) for k, s in shapes.items()}
    params = sum(t.numel() for t in master.values())
    gb = params * 2 / 1e9
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    print(
        f"{name}, torch {torch.__version__}: {params / 1e9:.3f}B parameters, {gb:.3f} GB per "
        f"version in bfloat16, {len(shapes)} tensors; {a.repeats} timed versions per path"
    )
    floor = memcpy_floor(master, a.repeats)
    start_local_ray(2)
    results = []
    try:
        for path in [p.strip() for p in a.paths.split(",") if p.strip()]:
            if path not in PATHS:
                raise SystemExit(f"unknown path {path!r}; choose from {', '.join(PATHS)}")
            results.append(run_path(path, a, master, device))
            print(
                f"  {path}: route {results[-1]['route']}, producer sees "
                f"CUDA_VISIBLE_DEVICES={results[-1]['CUDA_VISIBLE_DEVICES']}"
            )
    finally:
        import ray

        ray.shutdown()
    sums = {round(r["checksum"], 1) for r in results}
    base = next((r["handoff_s"] for r in results if r["path"] == "object store"), None)
    print()
    print(
        "| path | publish to loaded, median (min) s | publish call s | load s | GB/s | "
        "vs object store |\n|---|---|---|---|---|---|"
    )
    print(f"| memcpy floor | {floor:.4f} | - | - | {gb / floor:.1f} | - |")
    for r in results:
        speed = f"{base / r['handoff_s']:.1f}x" if base else "-"
        print(
            f"| {r['path']} | {r['handoff_s']:.4f} ({r['handoff_min_s']:.4f}) | "
            f"{r['publish_s']:.4f} | {r['load_s']:.4f} | {gb / r['handoff_s']:.1f} | "
            f"{speed} |"
        )
    print(f"\nloaded weights agree across paths: {len(sums) == 1} (checksums {sorted(sums)})")
    record = {
        "device": name,
        "torch": torch.__version__,
        "params": params,
        "gb": gb,
        "repeats": a.repeats,
        "memcpy_floor_s": floor,
        "paths": results,
    }
    Path(f"{a.out}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {a.out}.json")
    status = 0
    ipc = next((r for r in results if r["path"] == "cuda ipc"), None)
    if cuda and ipc is not None and not str(ipc["route"]).startswith("cuda_ipc"):
        print(f"the cuda ipc path did not use CUDA IPC on this GPU: {ipc['route']}")
        status = 2
    if len(sums) != 1:
        print("the paths loaded different weights")
        status = 3
    return status


if __name__ == "__main__":
    sys.exit(main())
