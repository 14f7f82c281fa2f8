"""Running prompts once and continuing several sequences from their key/value cache (training's
shared-prompt layout, generation's shared prefill): left-padded prompts and their positions, and
the cache of a Hugging Face causal LM across transformers releases (the keyword that passes it in,
``cache`` from 5.20 and ``past_key_values`` before, e.g. in the range vLLM's CPU build needs, and
the output field that carries it out)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword ``model``'s forward (and ``generate``) takes the cache by."""
    inner = getattr(model, "module", model)  # DDP keeps the model as .module
    return _cache_argument_of(type(inner))


@functools.cache
def _cache_argument_of(model_class: type) -> str:
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output: Any) -> Any:
    """The cache a forward with ``use_cache=True`` returned."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompts`` left-padded to the longest (int64 ids) and their attention mask (int64 0/1),
    so that every prompt ends at the last position, where its continuation starts."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def left_padded_positions(attention: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows, counted from each row's first real token (as
    ``generate`` counts them; padding positions are 0 and masked anyway)."""
    return (attention.cumsum(1) - 1).clamp_min(0)


def prompt_head_cache(
    model: torch.nn.Module, input_ids: torch.Tensor, attention: torch.Tensor
) -> Any:
    """The cache of every left-padded prompt token but the last, from one forward pass (the
    last token is the one the next generation step feeds in)."""
    head, head_mask = input_ids[:, :-1], attention[:, :-1]
    out = model(
        input_ids=head,
        attention_mask=head_mask,
        position_ids=left_padded_positions(head_mask),
        use_cache=True,
        logits_to_keep=1,
    )
    return output_cache(out)
