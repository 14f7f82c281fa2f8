"""Hugging Face checkpoints (safetensors; loadable with ``from_pretrained``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Protocol

from transformers import PreTrainedTokenizerBase


class PretrainedWriter(Protocol):
    """An :class:`~zbrl.training.engine.base.Engine` (or anything with a ``rank``) that writes
    itself in the ``from_pretrained`` layout; on a data-parallel engine every rank calls
    ``save_pretrained`` (a collective for sharded ones) and only rank 0 writes."""

    rank: int

    def save_pretrained(self, directory: Path) -> None: ...


def save_checkpoint(
    model: PretrainedWriter, tokenizer: PreTrainedTokenizerBase | None, directory: str | Path
) -> Path:
    """Write model (+ tokenizer) to ``directory`` atomically enough: a ``.partial`` dir renamed.
    Every rank calls it; only rank 0 touches the file system."""
    final = Path(directory)
    partial = final.with_name(final.name + ".partial")
    if model.rank == 0:
        partial.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(partial)
    if model.rank != 0:
        return final
    if tokenizer is not None:
        tokenizer.save_pretrained(partial)
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    return final
