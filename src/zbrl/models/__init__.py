"""The embedded default model: a locally built tokenizer, a tiny Llama, and its warm start."""

from zbrl.models.tiny import build_tiny_model, create_embedded_model, save_model_dir
from zbrl.models.tokenizer import CHAT_TEMPLATE, EOS_TOKEN, TAG_TOKENS, build_tokenizer
from zbrl.models.warm_start import (
    ensure_warm_start,
    evaluate,
    generate_responses,
    read_warm_start_summary,
    train_sft,
)

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "TAG_TOKENS",
    "build_tiny_model",
    "build_tokenizer",
    "create_embedded_model",
    "ensure_warm_start",
    "evaluate",
    "generate_responses",
    "read_warm_start_summary",
    "save_model_dir",
    "train_sft",
]
