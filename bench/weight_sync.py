"""Weight sync: seconds from ``publish`` to loaded in every receiver, against a memcpy floor.

Paths (one sender in this process, ``--receivers`` receivers in Ray actor processes, everything
on 127.0.0.1):

- ``memcpy floor``   one in-memory copy of all the weights' bytes (``dst.copy_(src)``, this
  process): no transport can deliver a version faster than the copy into the receiver;
- ``object store``   :class:`zbrl.transport.weight_sync.object_store.ObjectStorePublisher` /
  ``ObjectStoreReceiver`` (the default): a CPU copy put into Ray's object store, fetched by every
  receiver;
- ``tensor by tensor``  one gloo broadcast per tensor (a process group on the WeightStore
  rendezvous, no flattening): what a naive collective sync does;
- ``bucketed``       :class:`zbrl.transport.weight_sync.broadcast.BroadcastPublisher` /
  ``BroadcastReceiver`` (``transport.weight_sync.type=broadcast``): flattened into a staging
  buffer, broadcast in ``--bucket-mb`` buckets.

Every path ends with the same load in each receiver: a copy into preallocated tensors of the
model's shapes (what ``load_weights`` does). Seconds are medians over ``--repeats`` versions
(after one warm-up version that also forms the broadcast group), measured from the start of
``publish`` to the last receiver's load. For ``bucketed`` the time is split into staging (the
``publish`` call: the copy into the flat buffer), wire (the broadcast) and load.

The weights are shaped like a Llama-style decoder (embedding, untied LM head, per layer q/k/v/o,
gate/up/down and two norms) with the layer count chosen to reach ``--sizes`` MB, in bf16 and f32.
Memory: the sender holds the weights, the staging copy and the floor's destination; every
receiver a flat buffer and the loaded copy, so the 500 MB case needs about
(3 + 2 x receivers) x 500 MB; the script refuses to start with less than twice that available.

Usage::

    python bench/weight_sync.py                       # 50 and 500 MB, bf16 and f32: ~7 min
    python bench/weight_sync.py --sizes 50 --repeats 3 --dtypes bf16   # a quick look
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

MB = 1_000_000
PATHS = ("memcpy floor", "object store", "tensor by tensor", "bucketed")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="50,500", help="weights per version, MB, comma-separated")
    p.add_argument("--dtypes", default="bf16,f32", help="bf16, f32, comma-separated")
    p.add_argument("--receivers", type=int, default=2, help="receiving processes (producers)")
    p.add_argument("--repeats", type=int, default=5, help="timed versions per path")
    p.add_argument("--bucket-mb", type=float, default=4.0, help="bucket size (MiB)")
    p.add_argument("--paths", default=",".join(PATHS[1:]), help="comma-separated subset")
    p.add_argument("--out", default="weight_sync", help="prefix of the .csv and .png written")
    return p.parse_args(argv)


def model_shapes(target_bytes: int, element: int) -> dict[str, tuple[int, ...]]:
    """Llama-style tensor shapes whose total is close to ``target_bytes``."""
    vocab, hidden = (16000, 512) if target_bytes < 200 * MB else (32000, 1024)
    inter = (hidden * 11 // 4 + 63) // 64 * 64
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    rest = 2 * vocab * hidden + hidden
    layers = max(1, round((target_bytes / element - rest) / per_layer))
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        pre = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{pre}self_attn.{name}.weight"] = (hidden, hidden)
        shapes[f"{pre}mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{pre}mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{pre}mlp.down_proj.weight"] = (hidden, inter)
        shapes[f"{pre}input_layernorm.weight"] = (hidden,)
        shapes[f"{pre}post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def make_weights(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g).to(dtype) for k, s in shapes.items()}


def nbytes(weights: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in weights.values())


class Receiver:
    """A Ray actor: one receiver of the path under test, loading into model-shaped tensors."""

    def __init__(self, path: str, member: str, shapes: dict, dtype: str, store: Any, bc: Any):
        from zbrl.transport.clients import WeightStoreClient
        from zbrl.transport.handles import RayHandle
        from zbrl.transport.weight_sync.broadcast import BroadcastReceiver
        from zbrl.transport.weight_sync.object_store import ObjectStoreReceiver

        torch.set_num_threads(1)
        self.client = WeightStoreClient(RayHandle(store))
        self.model = {k: torch.empty(s, dtype=getattr(torch, dtype)) for k, s in shapes.items()}
        self.member, self.settings = member, bc
        self.receiver: Any = None
        if path == "object store":
            self.receiver = ObjectStoreReceiver(self.client, initial_version=0)
        elif path == "bucketed":
            self.receiver = BroadcastReceiver(self.client, bc, member, initial_version=0)
        self.group: Any = None
        self.load_s: list[float] = []

    def load(self, state: dict[str, torch.Tensor]) -> None:
        start = time.perf_counter()
        for k, t in self.model.items():
            t.copy_(state[k])
        self.load_s.append(time.perf_counter() - start)

    def wait(self, version: int) -> float:
        """Block until ``version`` is loaded; the wall-clock time it was."""
        assert self.receiver.wait_for(version, timeout=600), f"version {version} never came"
        assert self.receiver.receive_into(self.load)
        return time.time()

    def last_load_s(self) -> float:
        return self.load_s[-1]

    # tensor by tensor: a raw process group on the WeightStore's rendezvous
    def join_raw(self, rank: int, size: int) -> None:
        from zbrl.transport.weight_sync.broadcast import ActorStore, Collective, make_process_group

        store = ActorStore(self.client, "raw/", 120.0)
        pg = make_process_group("gloo", store, rank, size, 600.0, "127.0.0.1")
        self.group = Collective(store, pg, "gloo", rank)

    def recv_raw(self) -> float:
        state = {k: torch.empty_like(t) for k, t in self.model.items()}
        for t in state.values():
            self.group.broadcast(t.view(-1).view(torch.uint8))
        self.load(state)
        return time.time()

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
        if self.group is not None:
            self.group.close()


def memcpy_floor(weights: dict[str, torch.Tensor], repeats: int) -> list[float]:
    total = nbytes(weights)
    src = torch.empty(total, dtype=torch.uint8)
    src.random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        out.append(time.perf_counter() - start)
    return out


def run_path(path: str, weights: dict, shapes: dict, dtype: str, args: argparse.Namespace) -> dict:
    import ray

    from zbrl.transport.clients import WeightStoreClient
    from zbrl.transport.handles import RayHandle
    from zbrl.transport.weight_sync.broadcast import (
        ActorStore,
        BroadcastPublisher,
        BroadcastSettings,
        Collective,
        make_process_group,
    )
    from zbrl.transport.weight_sync.object_store import ObjectStorePublisher
    from zbrl.transport.weight_sync.store import WeightStore

    store = ray.remote(WeightStore).options(num_cpus=0, max_concurrency=64).remote()
    client = WeightStoreClient(RayHandle(store))
    bc = BroadcastSettings(
        bucket_bytes=int(args.bucket_mb * 2**20),
        backend="gloo",
        address="127.0.0.1",
        join_timeout_s=120.0,
        op_timeout_s=600.0,
        keepalive_s=5.0,
    )
    actor = ray.remote(Receiver).options(num_cpus=0)
    receivers = [
        actor.remote(path, f"producer-{i}", shapes, dtype, store, bc) for i in range(args.receivers)
    ]
    ray.get([r.__ray_ready__.remote() for r in receivers])
    totals, staging, loads = [], [], []
    try:
        if path == "tensor by tensor":
            size = args.receivers + 1
            joins = [r.join_raw.remote(i + 1, size) for i, r in enumerate(receivers)]
            kv = ActorStore(client, "raw/", 120.0)
            group = Collective(
                kv, make_process_group("gloo", kv, 0, size, 600.0, "127.0.0.1"), "gloo", 0
            )
            ray.get(joins)
            for rep in range(args.repeats + 1):
                start = time.time()
                done = [r.recv_raw.remote() for r in receivers]
                for t in weights.values():
                    group.broadcast(t.view(-1).view(torch.uint8))
                end = max(ray.get(done))
                if rep:
                    totals.append(end - start)
                    loads.append(max(ray.get([r.last_load_s.remote() for r in receivers])))
            group.close()
        else:
            publisher = (
                ObjectStorePublisher(client)
                if path == "object store"
                else BroadcastPublisher(client, bc)
            )
            for version in range(1, args.repeats + 2):
                start = time.time()
                publisher.publish(version, weights)
                staged = time.time() - start
                end = max(ray.get([r.wait.remote(version) for r in receivers]))
                if version > 1:  # the first forms the group and warms every path up
                    totals.append(end - start)
                    staging.append(staged)
                    loads.append(max(ray.get([r.last_load_s.remote() for r in receivers])))
            publisher.close()
    finally:
        ray.get([r.close.remote() for r in receivers])
        for a in [*receivers, store]:
            ray.kill(a)
    return {"total": totals, "staging": staging, "load": loads}


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def check_memory(args: argparse.Namespace) -> None:
    need = max(int(s) for s in args.sizes.split(",")) * MB * (3 + 2 * args.receivers)
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    if info["MemAvailable"] < 2 * need:
        sys.exit(
            f"needs about {need / 2**30:.1f} GiB and twice that available; "
            f"{info['MemAvailable'] / 2**30:.1f} GiB is: use smaller --sizes or --receivers"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_memory(args)
    import ray

    from zbrl.launch.ray_setup import LOOPBACK, loopback_only

    with loopback_only():
        ray.init(
            address="local",
            num_cpus=2,
            _node_ip_address=LOOPBACK,
            include_dashboard=False,
            logging_level="WARNING",
            object_store_memory=2 * 10**9,
        )
    torch.set_num_threads(1)
    paths = args.paths.split(",")
    rows = []
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            for dt in args.dtypes.split(","):
                dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dt]
                shapes = model_shapes(size * MB, dtype.itemsize)
                weights = make_weights(shapes, dtype, 0)
                total = nbytes(weights)
                floor = median(memcpy_floor(weights, args.repeats))
                rows.append(_row(size, dt, "memcpy floor", total, len(shapes), floor, floor, {}))
                for path in paths:
                    gc.collect()
                    times = run_path(path, weights, shapes, str(dtype).removeprefix("torch."), args)
                    rows.append(
                        _row(
                            size, dt, path, total, len(shapes), median(times["total"]), floor, times
                        )
                    )
                    print(_fmt(rows[-1]), flush=True)
                del weights
                gc.collect()
    finally:
        ray.shutdown()
    print_table(rows, args)
    write_outputs(rows, args)


def _row(size, dt, path, total, tensors, seconds, floor, times) -> dict:
    staging, load = median(times.get("staging", [])), median(times.get("load", []))
    wire = None
    if staging is not None and load is not None:
        wire = seconds - staging - load
    elif load is not None:
        wire = seconds - load
    return {
        "case": f"{size} MB {dt}",
        "path": path,
        "bytes": total,
        "tensors": tensors,
        "seconds": seconds,
        "MB_per_s": total / MB / seconds,
        "ratio_to_floor": seconds / floor,
        "staging_s": staging,
        "wire_s": wire,
        "load_s": load,
    }


def _fmt(r: dict) -> str:
    def f(x):
        return "-" if x is None else f"{x:.3f}"

    return (
        f"| {r['case']} | {r['path']} | {r['tensors']} | {f(r['seconds'])} | "
        f"{r['MB_per_s']:.0f} | {r['ratio_to_floor']:.1f}x | {f(r['staging_s'])} | "
        f"{f(r['wire_s'])} | {f(r['load_s'])} |"
    )


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(
        f"\nweight sync to {args.receivers} receivers on 127.0.0.1, gloo, bucket {args.bucket_mb}"
        f" MiB, medians of {args.repeats} versions, torch {torch.__version__}, "
        f"{datetime.date.today()}"
    )
    print("| case | path | tensors | seconds | MB/s | vs floor | staging s | wire s | load s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_fmt(r))


def write_outputs(rows: list[dict], args: argparse.Namespace) -> None:
    csv_path = Path(f"{args.out}.csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {csv_path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (the CSV has the numbers)")
        return
    cases = list(dict.fromkeys(r["case"] for r in rows))
    paths = list(dict.fromkeys(r["path"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(paths)
    for j, path in enumerate(paths):
        ys = [
            next((r["ratio_to_floor"] for r in rows if r["case"] == c and r["path"] == path), 0)
            for c in cases
        ]
        ax.bar([i + j * width for i in range(len(cases))], ys, width, label=path)
    ax.axhline(3, color="gray", linestyle="--", linewidth=1, label="3x floor (goal)")
    ax.set_xticks([i + width * (len(paths) - 1) / 2 for i in range(len(cases))], cases)
    ax.set_ylabel("seconds / memcpy floor")
    ax.set_yscale("log")
    ax.set_title(f"weight sync to {args.receivers} receivers on loopback (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = Path(f"{args.out}.png")
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
