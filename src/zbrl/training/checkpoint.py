"""Checkpoints: Hugging Face weights a user loads with ``from_pretrained``, plus what a run needs to
resume exactly.

Layout of one checkpoint, ``RUN_DIR/checkpoints/step-N`` (N = policy version = steps done)::

    config.json, model.safetensors, tokenizer files     the policy (``from_pretrained(step-N)``):
                         its float32 master weights, whatever the compute dtype, so that a
                         resumed engine continues from them bit for bit (docs/precision.md)
    zbrl/trainer.pt      consumer state: version, counters, optimizer + LR schedule, RNG
    zbrl/buffer.pt       rollout buffer state: untrained groups, tickets, each producer's
                         resume point (sampler position, RNG) — see zbrl.transport.buffer
    zbrl/meta.json       written last: version, time, and a manifest (size and SHA-256 of
                         every file) that says the checkpoint is complete

With ``model.lora`` the policy part is a peft adapter directory instead (``adapter_config.json``,
whose ``base_model_name_or_path`` names the base model's directory, and the float32
``adapter_model.safetensors``): ``peft.AutoPeftModelForCausalLM.from_pretrained(step-N)`` or
transformers' ``AutoModelForCausalLM.from_pretrained(step-N)`` (with peft installed) load the base
with the adapters, ``merge_and_unload()`` makes it a plain model; resuming loads the adapters onto
that base (:func:`zbrl.assembly.models.load_trained_policy`). See docs/scaling.md, LoRA.

Writing is atomic: everything goes into ``step-N.tmp-PID``, every file and the directory are
fsynced, and the directory is renamed to ``step-N`` (then the parent is fsynced). A reader
(:func:`find_latest`) takes the newest ``step-N`` whose manifest matches its files and skips,
with a warning, anything else (a temporary directory left by a crash, a directory cut short).
Only the newest ``keep`` complete checkpoints are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from zbrl.errors import RunError

if TYPE_CHECKING:  # the driver checks run dirs for checkpoints without importing transformers
    from transformers import PreTrainedTokenizerBase

STATE_DIR = "zbrl"
TRAINER_FILE = "trainer.pt"
BUFFER_FILE = "buffer.pt"
META_FILE = "meta.json"
FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")


class PretrainedWriter(Protocol):
    """An :class:`~zbrl.training.engine.base.Engine` (or anything with a ``rank``) that writes
    itself in the ``from_pretrained`` layout; on a data-parallel engine every rank calls
    ``save_pretrained`` (a collective for sharded ones) and only rank 0 writes."""

    rank: int

    def save_pretrained(self, directory: Path) -> None: ...


class CheckpointError(RunError):
    """A checkpoint is missing, incomplete or unreadable; the message names the path."""


class IncompleteCheckpointWarning(UserWarning):
    """A checkpoint directory was skipped because it is not complete."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk."""

    path: Path
    version: int
    meta: dict[str, Any]

    @property
    def trainer_file(self) -> Path:
        return self.path / STATE_DIR / TRAINER_FILE

    @property
    def buffer_file(self) -> Path:
        return self.path / STATE_DIR / BUFFER_FILE


def save_checkpoint(
    model: PretrainedWriter,
    tokenizer: PreTrainedTokenizerBase | None,
    directory: str | Path,
    state: dict[str, Any] | None = None,
) -> Path:
    """Write the model (+ tokenizer, + the resume ``state``: file name under ``zbrl/`` → picklable
    object) to ``directory`` atomically; returns ``directory``. An existing ``directory`` is
    replaced only once the new one is complete. Every rank of a data-parallel engine calls it
    (gathering a sharded model is a collective); only rank 0 touches the file system."""
    import torch

    final = Path(directory)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    if model.rank != 0:
        model.save_pretrained(tmp)  # joins the gather; writes nothing
        return final
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    (tmp / STATE_DIR).mkdir()
    for name, obj in (state or {}).items():
        torch.save(obj, tmp / STATE_DIR / name)
    version = _version_of(final.name)
    meta = {"format": FORMAT, "version": version, "written_at": time.time()}
    meta["files"] = _manifest(tmp)
    _write_synced(tmp / STATE_DIR / META_FILE, json.dumps(meta, indent=1) + "\n")
    _fsync_tree(tmp)
    if final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    _fsync_dir(final.parent)
    return final


def prune(checkpoint_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (0 keeps all); returns them.

    Completeness here is the manifest and every file's size (no hashing: this runs after every
    save, and reading back gigabytes each time would stall training); resuming verifies the
    SHA-256 of the checkpoint it loads."""
    if keep <= 0:
        return []
    complete = _complete_checkpoints(Path(checkpoint_dir), warn=False, hashes=False)
    doomed = [c.path for c in complete[:-keep]]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def find_latest(checkpoint_dir: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint under ``checkpoint_dir`` (None when there is none); each
    incomplete one met on the way is skipped with an :class:`IncompleteCheckpointWarning`."""
    complete = _complete_checkpoints(Path(checkpoint_dir), warn=True)
    return complete[-1] if complete else None


def has_checkpoints(checkpoint_dir: str | Path) -> bool:
    """Whether anything that looks like a checkpoint (complete or not) is there."""
    path = Path(checkpoint_dir)
    return path.is_dir() and any(_STEP_DIR.match(p.name) for p in path.iterdir())


def load_state(path: Path) -> Any:
    """Load one state file of a checkpoint; CheckpointError naming the file when it is corrupt."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(
            f"cannot read checkpoint file {path} ({type(exc).__name__}: {exc}); resume from "
            "an older checkpoint by moving this one out of the checkpoints directory"
        ) from None


def check_complete(path: Path, hashes: bool = True) -> Checkpoint:
    """The checkpoint at ``path``; CheckpointError saying what is wrong when it is not complete
    (``hashes=False`` checks each file's presence and size, not its SHA-256)."""
    meta_path = path / STATE_DIR / META_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is incomplete: {meta_path} is missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is incomplete: {meta_path} is unreadable ({exc})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {meta.get('format')!r}, this zbrl reads {FORMAT}"
        )
    for rel, want in meta["files"].items():
        problem = _file_problem(path / rel, want, hashes)
        if problem:
            raise CheckpointError(f"{path} is incomplete: {rel} {problem}")
    return Checkpoint(path=path, version=int(meta["version"]), meta=meta)


# -- internals -------------------------------------------------------------------------------


def _complete_checkpoints(
    checkpoint_dir: Path, warn: bool, hashes: bool = True
) -> list[Checkpoint]:
    if not checkpoint_dir.is_dir():
        return []
    found: list[Checkpoint] = []
    for path in sorted(checkpoint_dir.iterdir(), key=lambda p: p.name):
        if not path.is_dir():
            continue
        if not _STEP_DIR.match(path.name):
            if warn and ".tmp-" in path.name:
                _warn(f"skipping {path}: a checkpoint that was never finished")
            continue
        try:
            found.append(check_complete(path, hashes))
        except CheckpointError as exc:
            if warn:
                _warn(f"skipping {exc}")
    return sorted(found, key=lambda c: c.version)


def _warn(message: str) -> None:
    warnings.warn(message, IncompleteCheckpointWarning, stacklevel=3)


def _version_of(name: str) -> int:
    match = _STEP_DIR.match(name)
    if match is None:
        raise ValueError(f"checkpoint directory must be named step-N, got {name!r}")
    return int(match.group(1))


def _manifest(root: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = str(path.relative_to(root))
        out[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return out


def _file_problem(path: Path, want: dict[str, Any], hashes: bool) -> str | None:
    if not path.is_file():
        return "is missing"
    size = path.stat().st_size
    if size != want["size"]:
        return f"has {size} bytes, {want['size']} were written"
    if hashes and _sha256(path) != want["sha256"]:
        return "does not match the SHA-256 written with it (corrupt)"
    return None


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_synced(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            _fsync_path(path, os.O_RDONLY)
    for path in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    _fsync_path(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _fsync_path(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
