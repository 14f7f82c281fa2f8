"""Hugging Face checkpoints (safetensors; loadable with ``from_pretrained``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Protocol

from transformers import PreTrainedTokenizerBase


class PretrainedWriter(Protocol):
    """A model (or an :class:`~zbrl.training.engine.base.Engine`) that writes itself in the
    ``from_pretrained`` layout."""

    def save_pretrained(self, directory: Path) -> None: ...


def save_checkpoint(
    model: PretrainedWriter, tokenizer: PreTrainedTokenizerBase | None, directory: str | Path
) -> Path:
    """Write model (+ tokenizer) to ``directory`` atomically enough: a ``.partial`` dir renamed."""
    final = Path(directory)
    partial = final.with_name(final.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(partial)
    if tokenizer is not None:
        tokenizer.save_pretrained(partial)
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    return final
