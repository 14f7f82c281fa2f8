"""The key/value cache of a Hugging Face causal LM across transformers releases: the keyword that
passes it in (``cache`` from 5.20, ``past_key_values`` before, e.g. in the range vLLM's CPU build
needs) and the output field that carries it out. Used where zbrl runs a shared prompt once and
continues several sequences from its cache (training's shared-prompt layout, generation's
shared prefill)."""

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
