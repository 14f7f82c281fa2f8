"""Tiny random models of the current model families, built from transformers' own config classes
and sized to the embedded tokenizer, saved as model directories a user would pass as
``model.path``: Qwen3, Qwen3-MoE, Qwen3.5-text (linear-attention layers between full-attention
ones), Qwen3-Next (hybrid and MoE) and GPT-OSS (MoE with sliding-window layers).

``python -m zbrl.testing.model_families OUT_DIR`` writes one directory per family under
``OUT_DIR`` (``OUT_DIR/qwen3``, ``OUT_DIR/qwen3_moe``, ...) and prints their paths.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    GptOssConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
)
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

from zbrl.embedded.tiny_model import save_model_dir
from zbrl.embedded.tokenizer import build_tokenizer


def _common(tokenizer: PreTrainedTokenizerBase) -> dict:
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


_ROUTER_LOSS: dict[str, Any] = {"output_router_logits": True, "router_aux_loss_coef": 0.001}
"""The router's load-balancing loss, on, in every MoE family."""

_MOE: dict[str, Any] = {
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    **_ROUTER_LOSS,
}
"""The Qwen MoE layers' sizes: 4 experts, 2 active per token, every layer MoE."""

_LINEAR_ATTENTION: dict[str, Any] = {
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}
"""The hybrid Qwen models' gated-delta-net (linear attention) layers."""


def qwen3(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """A dense Qwen3 (q/k norms) of 2 layers."""
    return Qwen3Config(**_common(tokenizer), intermediate_size=128, num_hidden_layers=2)


def qwen3_moe(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """A Qwen3-MoE of 2 layers, 4 experts, 2 active per token, with its router loss on."""
    return Qwen3MoeConfig(
        **_common(tokenizer),
        intermediate_size=128,
        num_hidden_layers=2,
        **_MOE,
    )


def qwen3_5_text(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """A Qwen3.5 text model of 4 layers: 3 gated-delta-net (linear attention) layers, then one
    full-attention layer."""
    return Qwen3_5TextConfig(
        **_common(tokenizer),
        intermediate_size=128,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        **_LINEAR_ATTENTION,
    )


def qwen3_next(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """A Qwen3-Next of 4 layers (3 linear-attention, 1 full-attention), every layer MoE with 4
    experts (2 active) and a shared expert, router loss on."""
    return Qwen3NextConfig(
        **_common(tokenizer),
        intermediate_size=128,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        **_LINEAR_ATTENTION,
        shared_expert_intermediate_size=32,
        **_MOE,
    )


def gpt_oss(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """A GPT-OSS of 2 layers (a 4-token sliding window, then full attention), 4 experts (2
    active), router loss on."""
    return GptOssConfig(
        **_common(tokenizer),
        intermediate_size=32,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        **_ROUTER_LOSS,
    )


FAMILIES: dict[str, Callable[[PreTrainedTokenizerBase], PretrainedConfig]] = {
    "qwen3": qwen3,
    "qwen3_moe": qwen3_moe,
    "qwen3_5_text": qwen3_5_text,
    "qwen3_next": qwen3_next,
    "gpt_oss": gpt_oss,
}
"""Each family's tiny config, by directory name."""


def build_family_model(config: PretrainedConfig, *, seed: int = 0) -> PreTrainedModel:
    """A seeded random causal LM of ``config`` in float32, whose generation config stops at the
    config's EOS and pads with its PAD token."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model


def create_family_dir(family: str, model_dir: str | Path, *, seed: int = 0) -> Path:
    """Write ``family``'s tiny model and the embedded tokenizer to ``model_dir``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    tokenizer = build_tokenizer()
    model = build_family_model(FAMILIES[family](tokenizer), seed=seed)
    return save_model_dir(model, tokenizer, model_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="one model directory per family goes here")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    args = parser.parse_args(argv)
    for family in args.families:
        print(create_family_dir(family, args.out_dir / family))


if __name__ == "__main__":
    main()
