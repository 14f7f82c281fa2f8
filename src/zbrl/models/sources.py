"""Models as users name them: ``model.path`` / ``model.tokenizer_path`` -> a local HF directory.

A value is, in this order:

- ``embedded``: the tiny model built and warm-started locally (resolved elsewhere, see
  :mod:`zbrl.embedded.warm_start`);
- an existing local path: a Hugging Face model directory, or a ``.gguf`` file (dequantized once
  into the cache, :mod:`zbrl.models.gguf_convert`);
- a known model's short name (``smollm2-135m``): the directory ``zbrl models pull`` made
  (:mod:`zbrl.models.catalogue`);
- ``ORG/NAME``: a Hugging Face Hub id, downloaded into the hub's cache (:mod:`zbrl.models.hub`).

Anything else is a missing path. Resolution runs on the driver before any worker starts, so
workers only ever see local directories.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zbrl.errors import RunError
from zbrl.models import catalogue, gguf_convert, hub

EMBEDDED = "embedded"

SourceKind = Literal["embedded", "local", "gguf", "known", "hub", "missing"]

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")


@dataclass(frozen=True)
class ModelSource:
    spec: str
    """The value as the user wrote it."""
    kind: SourceKind


def classify(spec: str) -> ModelSource:
    if spec == EMBEDDED:
        return ModelSource(spec, "embedded")
    local = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        return ModelSource(spec, "gguf" if local.is_file() else "missing")
    if local.exists():
        return ModelSource(spec, "local")
    if spec in catalogue.KNOWN_MODELS:
        return ModelSource(spec, "known")
    if hub.looks_like_hub_id(spec):
        return ModelSource(spec, "hub")
    return ModelSource(spec, "missing")


def resolve(spec: str, cache_dir: str | Path, *, field: str, verbose: bool = True) -> Path:
    """The local directory ``spec`` names (not for ``embedded``): downloaded, converted or looked
    up as its kind says; a RunError naming ``field`` when it cannot be had."""
    source = classify(spec)
    if source.kind == "embedded":
        raise ValueError(
            "the embedded model is built by zbrl.embedded.warm_start, not resolved here"
        )
    if source.kind == "missing":
        raise RunError(missing_message(spec, field))
    if source.kind == "gguf":
        return gguf_convert.ensure_converted(spec, cache_dir, field=field, verbose=verbose)
    if source.kind == "known":
        return catalogue.pulled_dir(spec, cache_dir, field=field)
    if source.kind == "hub":
        return hub.fetch_hub_model(spec, field=field)
    return Path(spec).expanduser()


def missing_message(spec: str, field: str) -> str:
    if spec.endswith(".gguf"):
        return f"{field}={spec!r}: no such GGUF file; give the path of an existing .gguf file"
    known = ", ".join(sorted(catalogue.KNOWN_MODELS))
    return (
        f"{field}={spec!r} does not exist; give a local Hugging Face model directory, a .gguf "
        f"file, a Hugging Face Hub id (ORG/NAME), a pulled model's name ({known}; "
        "`zbrl models list`) or `embedded`"
    )


def check_model_dir(directory: Path, *, field: str, spec: str) -> None:
    """A RunError unless ``directory`` holds a model: ``config.json`` and weights."""
    where = f"{field}={spec!r}" + (f" ({directory})" if str(directory) != spec else "")
    if not directory.is_dir():
        raise RunError(
            f"{where} is a file, not a model directory; give the directory that holds "
            "config.json and the weights (or a .gguf file)"
        )
    if not (directory / "config.json").is_file():
        raise RunError(
            f"{where} is a directory without a model: it has no config.json; give a Hugging Face "
            "model directory (config.json and *.safetensors, as save_pretrained writes them)"
        )
    if not any(any(directory.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise RunError(
            f"{where} has a config.json but no weights (*.safetensors or pytorch_model*.bin); "
            "give a directory save_pretrained wrote, with its weights"
        )


def check_tokenizer_dir(directory: Path, *, field: str, spec: str) -> None:
    """A RunError unless ``directory`` holds tokenizer files."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not directory.is_dir() or not any((directory / n).is_file() for n in names):
        where = f"{field}={spec!r}" + (f" ({directory})" if str(directory) != spec else "")
        raise RunError(
            f"{where} holds no tokenizer (no tokenizer.json or tokenizer_config.json); set "
            "model.tokenizer_path to a directory with the model's tokenizer files"
        )
