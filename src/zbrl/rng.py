"""Every random number generator a worker uses, saved and restored as one picklable value.

A resumed run must draw the same random numbers the uninterrupted run would have drawn: torch's
CPU generator (sampling in generation, dropout), CUDA generators when present, Python's ``random``
and NumPy's global generator.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """A snapshot of this process's generators (CPU tensors and plain values)."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`; a snapshot taken with CUDA restores CUDA only where it exists."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
