"""Models: the embedded default (a locally built tokenizer, a tiny Llama, and its warm start) and
model sources as users name them (local directories, Hub ids, GGUF files, pulled models; see
:mod:`zbrl.models.sources`).

The names below are imported on first use, so that the light modules of this package (sources,
catalogue, the ``zbrl models`` command) load without torch and transformers.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "build_tiny_model": "zbrl.models.tiny",
    "create_embedded_model": "zbrl.models.tiny",
    "save_model_dir": "zbrl.models.tiny",
    "CHAT_TEMPLATE": "zbrl.models.tokenizer",
    "EOS_TOKEN": "zbrl.models.tokenizer",
    "TAG_TOKENS": "zbrl.models.tokenizer",
    "build_tokenizer": "zbrl.models.tokenizer",
    "ensure_warm_start": "zbrl.models.warm_start",
    "evaluate": "zbrl.models.warm_start",
    "generate_responses": "zbrl.models.warm_start",
    "read_warm_start_summary": "zbrl.models.warm_start",
    "train_sft": "zbrl.models.warm_start",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zbrl.models' has no attribute {name!r}")
