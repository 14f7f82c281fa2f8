"""How long a stopping run waits for the consumer's stop checkpoint (``launch.stop_grace_s``).

A stop (the first SIGINT/SIGTERM, or a failure the consumer survives) lets the consumer finish
the step it is in and write a checkpoint; only then do the roles return. So the wait must cover
one train step and one checkpoint write of *this* run, which range from a fraction of a second
(the embedded demo) to minutes (a 7B policy with its optimizer state, fsynced and hashed). The
run measures both (the ``train_step`` and ``checkpoint`` spans); the grace is
``MARGIN x (longest step + longest write) + FLOOR_S``. Until a checkpoint has been written, the
write is estimated from the policy's weights on disk: a checkpoint holds float32 master weights
and an optimizer state, up to ``CHECKPOINT_BYTES_PER_WEIGHT_BYTE`` times the weight files' size
(4 + 8 bytes a parameter against bf16's 2), written at ``ASSUMED_WRITE_BYTES_PER_S``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MARGIN = 2.0
"""Multiplies the measured (or estimated) step and write times."""
FLOOR_S = 20.0
"""Added to every grace: the roles' own return, Ray's calls, a slow disk's first fsync."""
CHECKPOINT_BYTES_PER_WEIGHT_BYTE = 6.0
"""A checkpoint's size over its weights' size, at most: the float32 master weights (4 bytes a
parameter) and two fp32 Adam moments (8 bytes), against the 2 bytes of bf16 weight files."""
ASSUMED_WRITE_BYTES_PER_S = 200e6
"""A conservative disk for the estimate before the first measured checkpoint."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class MeasuredTimes:
    """What the run has measured so far (None: not yet)."""

    longest_step_s: float | None
    """The longest ``train_step`` span."""
    longest_checkpoint_s: float | None
    """The longest ``checkpoint`` span (a checkpoint write)."""


def stop_grace_s(override: float | None, measured: MeasuredTimes, weights_bytes: int) -> float:
    """Seconds to wait for a stopping run: ``override`` when set (``launch.stop_grace_s``), else
    sized from ``measured`` (see the module docstring); ``weights_bytes`` is the policy's size on
    disk, used while no checkpoint write has been measured."""
    if override is not None:
        return override
    step = measured.longest_step_s or 0.0
    write = measured.longest_checkpoint_s
    if write is None:
        write = estimated_checkpoint_s(weights_bytes)
    return MARGIN * (step + write) + FLOOR_S


def estimated_checkpoint_s(weights_bytes: int) -> float:
    """A checkpoint write's seconds, estimated from the weights' bytes on disk."""
    return weights_bytes * CHECKPOINT_BYTES_PER_WEIGHT_BYTE / ASSUMED_WRITE_BYTES_PER_S


def weights_bytes(model_dir: Path) -> int:
    """Bytes of the weight files in a model directory (0 when there is none to read)."""
    try:
        files = [p for p in Path(model_dir).iterdir() if p.suffix in WEIGHT_SUFFIXES]
        return sum(p.stat().st_size for p in files if p.is_file())
    except OSError:
        return 0
