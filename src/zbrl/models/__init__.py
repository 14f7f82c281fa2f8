"""Models: the embedded default (a locally built tokenizer, a tiny Llama, and its warm start) and
model sources as users name them (local directories, Hub ids, GGUF files, pulled models; see
:mod:`zbrl.models.sources`).

The names below are imported on first use, so that the light modules of this package (sources,
catalogue, the ``zbrl models`` command) load without torch and transformers.
"""

from __future__ import annotations

from zbrl.lazy import lazy_attributes

_LAZY = {
    "build_tiny_model": "tiny",
    "create_embedded_model": "tiny",
    "save_model_dir": "tiny",
    "CHAT_TEMPLATE": "tokenizer",
    "EOS_TOKEN": "tokenizer",
    "TAG_TOKENS": "tokenizer",
    "build_tokenizer": "tokenizer",
    "ensure_warm_start": "warm_start",
    "evaluate": "warm_start",
    "generate_responses": "warm_start",
    "read_warm_start_summary": "warm_start",
    "train_sft": "warm_start",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_attributes(__name__, _LAZY)
