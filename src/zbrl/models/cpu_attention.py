"""Attention in float32 under CPU bfloat16 autocast: the CPU's bfloat16 SDPA backward is slow.

CPU autocast runs ``scaled_dot_product_attention`` in bfloat16 along with the matrix products.
The matrix products gain by it (oneDNN's bfloat16 kernels, about 4x float32's rate on the build
machine's AVX512-BF16 cores at the embedded model's training shapes), but PyTorch's CPU flash
attention backward in bfloat16 took 10.4 ms a call against 2.2 ms in float32 on the demo's
shapes, which gave back most of the gain. :func:`sdpa_in_float32` runs transformers' SDPA
attention with the queries, keys and values upcast to float32 and autocast off, and hands the
output back in the compute dtype; :func:`attention_in_float32` puts a model on it. The step's
gradients stay as close to float32's as before (the matrix products' rounding dominates:
tests/unit/test_mixed_precision.py). On GPUs, whose bfloat16 attention kernels are fast,
nothing changes. docs/precision.md, "Attention on CPU".
"""

from __future__ import annotations

from typing import Any

import torch

SDPA_FLOAT32 = "zbrl_sdpa_float32"
"""Name of :func:`sdpa_in_float32` in transformers' attention registry."""


def sdpa_in_float32(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention (same arguments, same masks) computed in float32."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with torch.autocast(device_type=query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(query.dtype), weights


def attention_in_float32(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Put ``model``'s SDPA attention on :func:`sdpa_in_float32` when it trains on CPU under
    bfloat16 autocast; whether it did (models without transformers' SDPA attention are left
    as they are)."""
    config = getattr(model, "config", None)
    if device.type != "cpu" or dtype != torch.bfloat16 or config is None:
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SDPA_FLOAT32, sdpa_in_float32)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SDPA_FLOAT32, sdpa_mask)
    model.set_attn_implementation(SDPA_FLOAT32)
    return True
