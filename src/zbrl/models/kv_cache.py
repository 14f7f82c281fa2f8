"""Running prompts once and continuing several sequences from their key/value cache (training's
shared-prompt layout, generation's shared prefill): left-padded prompts and their positions, and
the cache of a Hugging Face causal LM across transformers releases (the keyword that passes it in,
``cache`` from 5.20 and ``past_key_values`` before, e.g. in the range vLLM's CPU build needs, and
the output field that carries it out)."""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from zbrl.models.moe import forward_kwargs


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
        **forward_kwargs(model),
    )
    return output_cache(out)


def repeat_cache_rows(cache: Any, n: int) -> None:
    """Repeat every row of ``cache`` ``n`` times in place (row ``i`` becomes rows ``i*n`` to
    ``i*n + n - 1``), whatever its layers hold: keys and values, or a linear-attention layer's
    convolution and recurrent states (hybrid models such as Qwen3.5 and Qwen3-Next, whose
    transformers cache layers have no ``batch_repeat_interleave``)."""
    for layer in cache.layers:
        _map_linear_states(layer, lambda state: state.repeat_interleave(n, dim=0))
        if hasattr(layer, "batch_repeat_interleave"):  # keys and values (also of a mixed layer)
            layer.batch_repeat_interleave(n)


def select_cache_rows(cache: Any, index_B: torch.Tensor) -> None:
    """Replace ``cache``'s rows by rows ``index_B`` (by indexing, so the gradient reaches the
    pass that made the cache), for key/value and linear-attention layers alike.

    A linear-attention layer's cache overwrites its recurrent state in place after the next
    pass has read it, which autograd refuses when that state carries a gradient; its layers
    are given an ``update_recurrent_state`` that stores the new state instead
    (:func:`_store_recurrent_state`)."""
    for layer in cache.layers:
        _map_linear_states(layer, lambda state: state[index_B])
        if hasattr(layer, "batch_select_indices"):
            layer.batch_select_indices(index_B)
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            layer.update_recurrent_state = types.MethodType(_store_recurrent_state, layer)


def _store_recurrent_state(
    self: Any, recurrent_states: torch.Tensor | list[torch.Tensor], state_idx: int = 0, **kwargs
) -> torch.Tensor:
    """A linear-attention cache layer's ``update_recurrent_state`` that keeps the new state as
    the tensor the model computed (no in-place copy into the previous one, which the backward
    pass of the forward that read it still needs). Training passes only: no past recording."""
    last = recurrent_states if isinstance(recurrent_states, torch.Tensor) else recurrent_states[-1]
    self.recurrent_states[state_idx] = last
    self.is_recurrent_states_initialized[state_idx] = True
    return last


def _map_linear_states(layer: Any, fn: Any) -> None:
    """Apply ``fn`` to each convolution and recurrent state a linear-attention cache layer holds
    (nothing for other layers)."""
    if not isinstance(layer, LinearAttentionCacheLayerMixin):
        return
    for i in range(layer.number_of_states):
        if layer.is_conv_states_initialized[i]:
            layer.conv_states[i] = fn(layer.conv_states[i])
        if layer.is_recurrent_states_initialized[i]:
            layer.recurrent_states[i] = fn(layer.recurrent_states[i])
