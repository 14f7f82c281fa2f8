"""Builders for the inference-backend tests and benches: sampling settings and a tiny vLLM
engine's settings, so that each test states only what it changes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.backends.vllm_backend import VllmSettings


def sampling(
    n: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 12,
    stop: tuple[str, ...] | list[str] = (),
) -> SamplingParams:
    """``n`` completions per prompt, no top-p or top-k."""
    return SamplingParams(
        n=n,
        temperature=temperature,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=max_new_tokens,
        stop_strings=tuple(stop),
    )


TINY_VLLM = VllmSettings(
    dtype="float32",
    seed=0,
    max_model_len=128,
    enforce_eager=True,
    gpu_memory_utilization=0.5,
    tensor_parallel_size=1,
    cpu_kv_cache_gib=1,
    trust_remote_code=False,
    inflight_updates=False,
)
"""An engine for the embedded model: float32, eager, 1 GiB of CPU KV cache, prompts and
responses up to 128 tokens."""


def vllm_settings(**changes: Any) -> VllmSettings:
    """:data:`TINY_VLLM` with ``changes`` (field names of :class:`VllmSettings`)."""
    return replace(TINY_VLLM, **changes)
