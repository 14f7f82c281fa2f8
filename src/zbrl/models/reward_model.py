"""The embedded reward model: a tiny ``LlamaForSequenceClassification`` (one logit) over the
embedded tokenizer, saved like any user's reward model, so that
``AutoModelForSequenceClassification`` loads it back."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerBase

from zbrl.models.tiny import save_model_dir


def build_tiny_reward_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
) -> LlamaForSequenceClassification:
    """A randomly initialised (seeded) one-logit sequence classifier sized for ``tokenizer``; it
    reads the logit at each sequence's last non-pad token."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=512,
        num_labels=1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForSequenceClassification(config)


def save_reward_model(
    model: LlamaForSequenceClassification, tokenizer: PreTrainedTokenizerBase, out_dir: Path
) -> Path:
    """``save_pretrained`` the classifier and its tokenizer into ``out_dir``."""
    return save_model_dir(model, tokenizer, out_dir)  # type: ignore[arg-type]
