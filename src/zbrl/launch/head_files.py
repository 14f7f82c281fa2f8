"""The run directory on the driver's node, written by workers on other nodes: checkpoints, eval
files and the trained-uid log end up where ``zbrl resume`` and ``zbrl report`` on the driver's
node (the head) find them, without a shared file system (docs/cluster.md, Files on a cluster).

A worker on another node writes what it writes into a run directory of its own node
(:func:`node_run_dir`, under ``logging.cache_dir``) as on a single node, then copies it to the
:class:`HeadFiles` actor, which runs on the driver's node and writes into the run directory
there: a checkpoint is streamed file by file in chunks of ``CHUNK_BYTES`` (one chunk in flight,
so neither side holds a whole checkpoint in memory) into ``step-N.tmp-head``, checked against the
manifest the consumer wrote, and renamed to ``step-N`` — the same atomic publication as
:func:`zbrl.training.checkpoint.save_checkpoint`, so a head that is stopped mid-copy is left with
no half checkpoint that resume would take. The copy runs inside the consumer's checkpoint span:
a stop waits for it (``launch.stop_grace_s`` is sized from that span).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from zbrl.launch.shipping import CHUNK_BYTES, on_driver_node

REMOTE_RUNS_DIR = "node-runs"
"""Under ``logging.cache_dir`` of a node that is not the driver's: the runs' directories there."""


class HeadFiles:
    """A Ray actor on the driver's node that writes into the run directory there."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = Path(run_dir)

    def _path(self, rel: str) -> Path:
        path = (self.run_dir / rel).resolve()
        if self.run_dir.resolve() not in path.parents:
            raise ValueError(f"{rel!r} is not inside the run directory {self.run_dir}")
        return path

    def begin(self, rel: str) -> None:
        """Start writing ``rel`` from nothing."""
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")

    def append(self, rel: str, data: bytes) -> None:
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as f:
            f.write(data)

    def replace(self, rel: str, data: bytes) -> None:
        """Write the whole file ``rel`` atomically (a temporary file renamed into place)."""
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-head")
        tmp.write_bytes(data)
        tmp.replace(path)

    def publish_checkpoint(self, rel_tmp: str, rel_final: str, keep: int) -> str:
        """Check the streamed checkpoint ``rel_tmp`` against its manifest (sizes and SHA-256),
        rename it to ``rel_final`` (replacing one there), keep the newest ``keep``; the final
        path."""
        from zbrl.training.checkpoint import CheckpointError, check_complete, prune

        tmp, final = self._path(rel_tmp), self._path(rel_final)
        try:
            check_complete(tmp)
        except CheckpointError:  # names the file that did not arrive whole
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():
            old = final.with_name(f"{final.name}.old-head")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        fd = os.open(final.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        prune(final.parent, keep)
        return str(final)


def node_run_dir(run_dir: str, driver_node: str, cache_dir: str | Path) -> Path:
    """Where a worker writes the run's files: ``run_dir`` itself on the driver's node, else a
    directory of this node's cache named after it."""
    if on_driver_node(driver_node):
        return Path(run_dir)
    tag = hashlib.sha256(run_dir.encode()).hexdigest()[:12]
    return Path(cache_dir).absolute() / REMOTE_RUNS_DIR / f"{Path(run_dir).name}-{tag}"


class HeadMirror:
    """A worker's side: copies what it wrote under its node's run directory ``local_run_dir`` to
    the same place under the head's (through the :class:`HeadFiles` actor ``head``)."""

    def __init__(self, head: Any, local_run_dir: Path) -> None:
        self.head = head
        self.local_run_dir = local_run_dir

    def rel(self, path: Path) -> str:
        return str(Path(path).relative_to(self.local_run_dir))

    def checkpoint_saved(self, path: Path, keep: int) -> None:
        """Stream the checkpoint directory ``path`` to the head and publish it there."""
        import ray

        rel_final = self.rel(path)
        rel_tmp = f"{rel_final}.tmp-head"
        for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
            rel = f"{rel_tmp}/{file.relative_to(path)}"
            ray.get(self.head.begin.remote(rel))
            with file.open("rb") as f:
                while block := f.read(CHUNK_BYTES):
                    ray.get(self.head.append.remote(rel, block))
        ray.get(self.head.publish_checkpoint.remote(rel_tmp, rel_final, keep))

    def line_appended(self, path: Path, line: str) -> None:
        """Append ``line`` (just appended to ``path``) to the head's copy of ``path``."""
        import ray

        ray.get(self.head.append.remote(self.rel(path), line.encode()))

    def file_written(self, path: Path) -> None:
        """Copy the (small) file ``path`` to the head whole: an eval file, the uid log."""
        import ray

        ray.get(self.head.replace.remote(self.rel(path), Path(path).read_bytes()))
