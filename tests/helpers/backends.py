"""Builders for the inference-backend tests and benches: sampling settings, a tiny vLLM engine's
settings, the reference log-probs a backend is checked against (and the largest error against
them), and random LoRA adapters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch

from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.backends.vllm.backend import VllmSettings


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


def reference_logprobs(
    model: Any, prompt: list[int], response: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``log_softmax(logits / T)`` of each ``response`` token from ONE unpadded transformers
    forward pass over ``prompt + response`` on the model's device (the value a backend's
    recorded log-probs are checked against); float32 ``[len(response)]`` on the CPU."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + response.tolist()], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float().cpu()
    p = len(prompt)
    steps = logits[p - 1 : p - 1 + response.numel()] / temperature
    return torch.log_softmax(steps, dim=-1).gather(1, response.view(-1, 1).cpu()).squeeze(1)


def max_logprob_error(
    model: Any, prompts: list[list[int]], groups: list[list[Any]], temperature: float
) -> float:
    """The largest ``|recorded - reference|`` log-prob over every token of every non-empty
    completion in ``groups`` (one group of completions per prompt of ``prompts``), the reference
    being :func:`reference_logprobs` of ``model``."""
    return max(
        float(
            (c.logprobs - reference_logprobs(model, prompt, c.token_ids, temperature)).abs().max()
        )
        for prompt, group in zip(prompts, groups, strict=True)
        for c in group
        if c.token_ids.numel()
    )


def check_finish(completion: Any, tokenizer: Any, max_new_tokens: int) -> None:
    """AssertionError unless ``completion`` (sampled without stop strings) ends as the engine
    must end it: 1 to ``max_new_tokens`` tokens, nothing after the first EOS, ``length`` at
    exactly ``max_new_tokens`` tokens without EOS or else ``stop`` on an EOS, and the text its
    tokens decoded without special tokens."""
    ids = completion.token_ids.tolist()
    eos = tokenizer.eos_token_id
    assert 1 <= len(ids) <= max_new_tokens and eos not in ids[:-1]
    if completion.finish_reason == "length":
        assert len(ids) == max_new_tokens and eos not in ids
    else:
        assert completion.finish_reason == "stop" and ids[-1] == eos
    assert completion.text == tokenizer.decode(ids, skip_special_tokens=True)


def random_lora_adapters(
    model: Any, rank: int, seed: int, targets: Iterable[str]
) -> dict[str, torch.Tensor]:
    """peft-named ``lora_A``/``lora_B`` tensors for every ``torch.nn.Linear`` of ``model`` whose
    last name is in ``targets``, both nonzero (B = 0, peft's start, would change nothing)."""
    gen = torch.Generator().manual_seed(seed)
    names = set(targets)
    tensors = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in names:
            stem = f"base_model.model.{name}"
            tensors[f"{stem}.lora_A.weight"] = (
                torch.randn(rank, module.in_features, generator=gen) * 0.3
            )
            tensors[f"{stem}.lora_B.weight"] = torch.randn(module.out_features, rank, generator=gen)
    return tensors
