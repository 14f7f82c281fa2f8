"""Encoded prompts, cached: a start whose datasets, tokenizer, chat template and data settings are
those of an earlier start takes that start's encoded prompts instead of loading transformers and
encoding every prompt again (about 2 s of CPU in the driver for the demo's 4,000 prompts on these
cores; docs/performance.md, Start-up).

The key hashes everything the encoding reads: the bytes of every set's file, of the tokenizer's
files (every file of its directory but the weights) and of a ``model.chat_template`` file; the
``data``, ``reward`` and ``environment`` sections and ``eval.max_prompts``; the versions of
transformers, tokenizers and jinja2; and the source of zbrl's own loading and encoding code. A
set that is not a file (``data.source``), a tokenizer with ``model.trust_remote_code`` or a reward
given as an import path is never cached (code the key cannot see could change the prompts).

An entry is written only after every set was encoded and checked, whole (a temporary file renamed
into place), as JSON; the :data:`KEEP` entries used last are kept (a start that takes an entry
marks it used, so the entry of the run a user repeats outlives the entries that tests, other
branches or other settings write beside it in a shared cache).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zbrl.config import RunConfig
from zbrl.config.plugin import is_import_path

if TYPE_CHECKING:
    from zbrl.assembly.artifacts import Artifacts
    from zbrl.types import EncodedPrompt

VERSION = 1
"""Bump when the entries' layout changes."""
KEEP = 8
"""Entries kept in ``logging.cache_dir/prompts`` (those written or taken last)."""
WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack"})
"""Files of a tokenizer directory left out of the key: a model's weights, never read to encode."""
CODE = (
    "assembly/datasets.py",
    "assembly/environments.py",
    "assembly/prompt_cache.py",
    "assembly/model_source.py",
    "data/dataset.py",
    "data/prompts.py",
    "environments/tool_prompt.py",
    "environments/tools.py",
    "models/chat_template.py",
    "rewards/answers.py",
)
"""zbrl's own files that load and encode prompts (relative to the package)."""

Encoded = tuple[list["EncodedPrompt"], dict[str, Any]]
"""One set's prompts and encoding stats, as :func:`zbrl.assembly.datasets.encode_prompts`
returns them."""


def cache_key(cfg: RunConfig, artifacts: Artifacts) -> str | None:
    """The key of this start's encoded prompts; None when they are not cached (see above)."""
    refs = {
        "train": artifacts.train_path,
        **{f"eval.{k}": v for k, v in artifacts.eval_paths.items()},
    }
    if cfg.model.trust_remote_code or is_import_path(cfg.reward.type):
        return None
    if not all(isinstance(ref, Path) and ref.is_file() for ref in refs.values()):
        return None
    template = cfg.model.chat_template
    template_file = Path(template) if template and Path(template).is_file() else None
    package = Path(__file__).resolve().parents[1]
    blob = {
        "v": VERSION,
        "sets": {name: _digest(Path(ref)) for name, ref in refs.items()},
        "tokenizer": _tokenizer_digest(artifacts.tokenizer_dir),
        "chat_template": template,
        "chat_template_file": _digest(template_file) if template_file else None,
        "data": cfg.data.model_dump(mode="json"),
        "reward": cfg.reward.model_dump(mode="json"),
        "environment": cfg.environment.model_dump(mode="json") if cfg.environment else None,
        "eval_max_prompts": cfg.eval.max_prompts,
        "packages": {p: _version(p) for p in ("transformers", "tokenizers", "jinja2")},
        "code": {name: _digest(package / name) for name in CODE},
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:24]


def load(cfg: RunConfig, key: str) -> tuple[Encoded, dict[str, Encoded]] | None:
    """The training set's and each eval set's encoded prompts cached under ``key``, else None."""
    from zbrl.types import EncodedPrompt

    path = entry_path(cfg, key)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None

    def encoded(d: dict[str, Any]) -> Encoded:
        return [EncodedPrompt(uid, ids, example) for uid, ids, example in d["prompts"]], d["stats"]

    with contextlib.suppress(OSError):  # used now: kept over the entries not used since
        os.utime(path)
    print(f"[zbrl] encoded prompts: reusing {path}", flush=True)
    return encoded(data["train"]), {name: encoded(d) for name, d in data["evals"].items()}


def save(cfg: RunConfig, key: str, train: Encoded, evals: dict[str, Encoded]) -> None:
    """Cache a start's encoded prompts under ``key`` (silently not, when they are not plain
    JSON or the cache cannot be written: the next start encodes them again)."""

    def plain(e: Encoded) -> dict[str, Any]:
        return {"prompts": [[p.uid, p.prompt_ids, p.example] for p in e[0]], "stats": e[1]}

    path = entry_path(cfg, key)
    try:
        text = json.dumps({"train": plain(train), "evals": {n: plain(e) for n, e in evals.items()}})
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        return
    _prune(path.parent)


def entry_path(cfg: RunConfig, key: str) -> Path:
    return Path(cfg.logging.cache_dir) / "prompts" / f"{key}.json"


def _prune(directory: Path) -> None:
    entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        old.unlink(missing_ok=True)


def _tokenizer_digest(directory: Path) -> dict[str, str]:
    return {
        f.name: _digest(f)
        for f in sorted(Path(directory).iterdir())
        if f.is_file() and f.suffix not in WEIGHT_SUFFIXES
    }


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
