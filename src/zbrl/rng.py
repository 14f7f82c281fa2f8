"""Every random number generator a worker uses, saved and restored as one picklable value.

A resumed run must draw the same random numbers the uninterrupted run would have drawn: torch's
CPU generator (sampling in generation, dropout), CUDA generators when present, Python's ``random``
and NumPy's global generator.

Torch's generator states are kept as NumPy byte arrays: the snapshot travels with a producer's
resume point through the rollout buffer, whose process never imports torch (docs/performance.md,
Start-up). Snapshots of older checkpoints, with tensors, restore as well.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """A snapshot of this process's generators (CPU tensors and plain values)."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state().numpy(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.numpy() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`; a snapshot taken with CUDA restores CUDA only where it exists."""
    torch.set_rng_state(_byte_tensor(state["torch"]))
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_byte_tensor(s) for s in state["cuda"]])


def _byte_tensor(saved: Any) -> torch.Tensor:
    """A generator state as torch takes it: a uint8 tensor (from an array, or one already)."""
    if isinstance(saved, torch.Tensor):
        return saved
    return torch.from_numpy(np.array(saved, dtype=np.uint8))  # a copy: writable
