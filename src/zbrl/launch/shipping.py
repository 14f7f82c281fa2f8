"""Directories the workers read, shipped through Ray's object store to nodes that are not the
driver's, so that a cluster needs no shared file system (docs/cluster.md, Files on a cluster).

The driver resolves the model, tokenizer and checkpoint directories on its own node. On a
single-node Ray (every local run) nothing is shipped: a worker reads the driver's path. On a
cluster the driver puts each file of a directory into the object store once, in chunks of
``CHUNK_BYTES``, and hands the workers a :class:`ShippedDir`; a worker on the driver's node reads
the driver's path, a worker on another node calls :func:`local_dir`, which writes the files once
per node into ``LOGGING.CACHE_DIR/shipped/FINGERPRINT`` (atomically: a temporary directory renamed
into place, so workers of one node share one copy, and a cache on a shared file system is
written once in all) and returns that directory.

A directory's fingerprint is the SHA-256 of the driver's host name, the directory's absolute
path and every file's relative name, size and modification time (nanoseconds): a changed file
gets a new copy, without the driver hashing gigabytes of weights at every start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK_BYTES = 64 << 20
"""Bytes of one object a file is put into the object store as (a file of N bytes is
ceil(N / CHUNK_BYTES) objects, so a worker never holds more than one chunk it has not written)."""
SHIPPED_DIR = "shipped"
"""Under ``logging.cache_dir``: one directory per fingerprint shipped to this node."""


@dataclass(frozen=True)
class ShippedDir:
    """A directory of the driver's node as a worker receives it."""

    path: str
    """The directory's absolute path on the driver's node."""
    driver_node: str
    """The Ray node id of the driver's node (where ``path`` is read as it is)."""
    fingerprint: str = ""
    """Names the directory's content (see the module docstring); empty when nothing is shipped."""
    chunks: dict[str, list[Any]] = field(default_factory=dict)
    """Relative file name -> the object refs of its chunks, in order; empty on a single node."""

    @property
    def shipped(self) -> bool:
        return bool(self.chunks)


def fingerprint(directory: Path) -> str:
    """The fingerprint of ``directory`` (see the module docstring)."""
    digest = hashlib.sha256(f"{socket.gethostname()}\0{directory.absolute()}\0".encode())
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(
            f"{path.relative_to(directory)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode()
        )
    return digest.hexdigest()[:32]


class Shipper:
    """The driver's side: :meth:`ship` a directory (each one put into the object store once per
    run, and only when the cluster has more than one node)."""

    def __init__(self, driver_node: str, *, multi_node: bool) -> None:
        self.driver_node = driver_node
        self.multi_node = multi_node
        self._shipped: dict[Path, ShippedDir] = {}

    def ship(self, directory: Path) -> ShippedDir:
        """``directory`` as the workers receive it (its files in the object store on a
        cluster)."""
        directory = Path(directory).absolute()
        if not self.multi_node:
            return ShippedDir(str(directory), self.driver_node)
        if directory not in self._shipped:
            self._shipped[directory] = ShippedDir(
                str(directory), self.driver_node, fingerprint(directory), put_files(directory)
            )
        return self._shipped[directory]


def put_files(directory: Path) -> dict[str, list[Any]]:
    """Every file under ``directory`` put into the object store in chunks of ``CHUNK_BYTES``."""
    import ray

    chunks: dict[str, list[Any]] = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        refs = []
        with path.open("rb") as f:
            while block := f.read(CHUNK_BYTES):
                refs.append(ray.put(block))
        chunks[str(path.relative_to(directory))] = refs or [ray.put(b"")]
    return chunks


def this_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def on_driver_node(driver_node: str) -> bool:
    """Whether the calling worker runs on the driver's node (where the driver's paths hold)."""
    return this_node() == driver_node


def local_dir(shipped: ShippedDir, cache_dir: str | Path) -> Path:
    """Where the calling worker reads ``shipped``: the driver's path on the driver's node (and
    whenever nothing was shipped), else this node's copy under ``cache_dir``, written on first
    use."""
    if not shipped.shipped or on_driver_node(shipped.driver_node):
        return Path(shipped.path)
    target = Path(cache_dir).absolute() / SHIPPED_DIR / shipped.fingerprint
    if target.is_dir():
        return target
    import ray

    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, refs in shipped.chunks.items():
        out = tmp / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("wb") as f:
            for ref in refs:  # one chunk in memory at a time
                f.write(ray.get(ref))
    try:
        tmp.rename(target)
    except OSError:  # another worker of this node (or of a node sharing the cache) won
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():
            raise
    return target


def local_path(shipped: ShippedDir, local: Path, driver_path: str) -> Path:
    """The file ``driver_path`` (inside ``shipped``'s directory on the driver's node) in this
    worker's copy ``local``."""
    return local / Path(driver_path).relative_to(shipped.path)
