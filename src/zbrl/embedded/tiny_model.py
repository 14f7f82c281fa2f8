"""The embedded tiny causal LM: a small Llama built from a config, saved like a user's model.

``create_embedded_model(dir)`` writes ``config.json``, ``model.safetensors``,
``generation_config.json`` and the tokenizer files with ``save_pretrained``; the directory then
loads with ``AutoModelForCausalLM.from_pretrained(dir)`` / ``AutoTokenizer.from_pretrained(dir)``
exactly like a downloaded model. It is a Llama (not Qwen2) so that transformers 5 keeps the
locally built tokenizer as is (see :mod:`zbrl.embedded.tokenizer`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from zbrl.embedded.tokenizer import build_tokenizer


def tiny_model_config(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
) -> LlamaConfig:
    """The tiny model's ``LlamaConfig`` sized for ``tokenizer`` (no weights: the memory plan
    reads the embedded model's shape from it, :mod:`zbrl.planning.model_shape`).

    ``intermediate_size`` defaults to ``4 * hidden_size``. Embeddings are tied.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_model(config: LlamaConfig, *, seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised (seeded) ``LlamaForCausalLM`` of ``config`` (a
    :func:`tiny_model_config`). The model's generation config stops at the tokenizer's EOS and
    pads with its PAD token, as ``config`` names them.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model


def save_model_dir(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, model_dir: str | Path
) -> Path:
    """``save_pretrained`` model (safetensors), generation config and tokenizer into one dir."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    portable_tokenizer_class(model_dir)
    return model_dir


def portable_tokenizer_class(model_dir: str | Path) -> None:
    """Name the saved tokenizer's class ``PreTrainedTokenizerFast``.

    transformers 5 writes ``tokenizer_class: "TokenizersBackend"``, a name other loaders (vLLM's
    tokenizer loading among them, transformers 4) do not know; ``PreTrainedTokenizerFast`` loads
    the same ``tokenizer.json`` everywhere.
    """
    path = Path(model_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def create_embedded_model(model_dir: str | Path, *, seed: int = 0, **arch) -> Path:
    """Write a freshly initialised tiny model + tokenizer to ``model_dir`` and return it.

    ``arch`` overrides :func:`tiny_model_config`'s size arguments (``hidden_size``, ...).
    """
    tokenizer = build_tokenizer()
    model = build_tiny_model(tiny_model_config(tokenizer, **arch), seed=seed)
    return save_model_dir(model, tokenizer, model_dir)
