"""Hugging Face checkpoints (safetensors; loadable with ``from_pretrained``)."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase


def save_checkpoint(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, directory: str | Path
) -> Path:
    """Write model (+ tokenizer) to ``directory`` atomically enough: a ``.partial`` dir renamed."""
    final = Path(directory)
    partial = final.with_name(final.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(partial, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(partial)
    if final.exists():
        _remove_tree(final)
    partial.rename(final)
    return final


def _remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()
