"""GGUF files as model sources: dequantized once into an ordinary Hugging Face directory.

transformers reads a GGUF file (with the ``gguf`` and ``accelerate`` packages installed) into a
dequantized model, but refuses ``save_pretrained`` on it. So the conversion builds a fresh model
from the loaded config without its ``quantization_config``, copies the weights in with a strict
``load_state_dict``, and saves that next to the tokenizer the file carries (vocabulary, merges,
special tokens and its chat template). The result is cached under
``cache_dir/gguf/<stem>-<key>``, the key taken from the file's name, size and modification time;
it is built under a temporary name with a marker written last and renamed into place, so an
interrupted conversion is never reused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from zbrl.errors import RunError

MARKER = "ZBRL_GGUF_COMPLETE"
"""Written last into a converted directory: JSON naming the source file and its key."""

INSTALL_HINT = "pip install 'zbrl[gguf]' (or: pip install gguf accelerate)"


def missing_gguf_packages() -> list[str]:
    return [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]


def check_gguf_packages(field: str, path: str | Path) -> None:
    missing = missing_gguf_packages()
    if missing:
        raise RunError(
            f"{field}={str(path)!r} is a GGUF file, and reading one needs the packages "
            f"{' and '.join(missing)}, not installed in this environment: {INSTALL_HINT}"
        )


def source_key(gguf_file: Path) -> str:
    """Identifies one version of a file without reading it: name, size and mtime."""
    st = gguf_file.stat()
    raw = f"{gguf_file.name}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def converted_dir(gguf_file: Path, cache_dir: Path) -> Path:
    return cache_dir / "gguf" / f"{gguf_file.stem}-{source_key(gguf_file)}"


def is_converted(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def ensure_converted(
    gguf_file: str | Path, cache_dir: str | Path, *, field: str, verbose: bool = True
) -> Path:
    """The HF directory converted from ``gguf_file`` in ``cache_dir``; converts on first use."""
    gguf_file = Path(gguf_file).expanduser()
    target = converted_dir(gguf_file, Path(cache_dir))
    if not is_converted(target):
        check_gguf_magic(field, gguf_file)
        check_gguf_packages(field, gguf_file)
        try:
            convert_gguf(gguf_file, target, verbose=verbose)
        except ValueError as exc:  # transformers refuses the file (an unknown architecture)
            raise RunError(
                f"{field}={str(gguf_file)!r}: transformers cannot read this GGUF file ({exc}); "
                "give a GGUF of an architecture transformers supports, or a Hugging Face model "
                "directory"
            ) from None
    return target


GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""


def check_gguf_magic(field: str, gguf_file: Path) -> None:
    """A RunError unless ``gguf_file`` starts with the GGUF magic bytes (a download cut short, an
    HTML error page or a renamed file would otherwise fail deep inside the conversion)."""
    with open(gguf_file, "rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise RunError(
            f"{field}={str(gguf_file)!r} is not a GGUF file (it does not start with the GGUF "
            f"magic bytes, but {head!r}); give a .gguf file as llama.cpp writes it (download it "
            "again if it was cut short), or a Hugging Face model directory"
        )


def convert_gguf(gguf_file: Path, target: Path, *, verbose: bool = True) -> Path:
    """Dequantize ``gguf_file`` into the HF directory ``target`` (replaced if it exists)."""
    started = time.perf_counter()
    if verbose:
        size_mb = gguf_file.stat().st_size / 1e6
        print(
            f"[zbrl] converting {gguf_file} ({size_mb:.0f} MB) to a Hugging Face directory "
            f"{target} (once)",
            flush=True,
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".gguf-", dir=target.parent))
    try:
        _write_hf_dir(gguf_file, work)
        marker = {"source": str(gguf_file.resolve()), "key": source_key(gguf_file)}
        (work / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        os.chmod(work, 0o755)  # mkdtemp's 0700 would hide it from other users of the cache
        if target.exists():
            shutil.rmtree(target)
        try:
            os.rename(work, target)
        except OSError:  # another process finished the same conversion first
            if not is_converted(target):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if verbose:
        print(f"[zbrl] converted in {time.perf_counter() - started:.1f}s", flush=True)
    return target


def _write_hf_dir(gguf_file: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    where = {"pretrained_model_name_or_path": gguf_file.parent, "gguf_file": gguf_file.name}
    loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(**where)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
