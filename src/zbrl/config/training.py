"""How the consumers batch and run the optimisation, and the engine that spreads it over them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from zbrl.config.base import Section
from zbrl.config.plugin import as_plugin_dict, plugin_union

CollectiveBackend = Literal["auto", "gloo", "nccl"]
"""torch.distributed backend of the consumers' group: ``auto`` is NCCL when the consumers have
GPUs (``launch.consumer_num_gpus > 0``), gloo otherwise."""


class SingleEngine(Section):
    """One consumer process trains the whole model (``launch.num_consumers`` must be 1)."""

    type: Literal["single"] = "single"
    """Engine discriminator."""


class DdpEngine(Section):
    """Data parallel (torch DDP): every consumer holds the full model and optimizer state;
    gradients are all-reduced once per optimizer step (after the last micro-batch)."""

    type: Literal["ddp"] = "ddp"
    """Engine discriminator."""
    backend: CollectiveBackend = "auto"
    """Collective backend of the consumers' process group."""


class Fsdp2Engine(Section):
    """Fully sharded data parallel (torch FSDP2, ``fully_shard`` per decoder layer, then the
    root): parameters, gradients and optimizer state are sharded over the consumers; full weights
    are gathered to rank 0's CPU only to publish and to checkpoint."""

    type: Literal["fsdp2"] = "fsdp2"
    """Engine discriminator."""
    backend: CollectiveBackend = "auto"
    """Collective backend of the consumers' process group."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward (less memory, one more
    all-gather in the backward)."""
    cpu_offload: bool = False
    """Keep the sharded parameters, gradients and optimizer state in CPU memory (FSDP2's
    CPUOffloadPolicy): each layer's shard is copied to the device for its forward and backward
    and the optimizer steps on the CPU. Trades step time for device memory (docs/scaling.md)."""
    context_parallel_size: int = Field(default=1, ge=1)
    """Consumers that split each sequence's tokens between them (Ulysses sequence parallelism:
    attention heads are exchanged all-to-all); must divide ``launch.num_consumers``. 1: off."""


EngineConfig = plugin_union(SingleEngine, DdpEngine, Fsdp2Engine)


class TrainingConfig(Section):
    """Train batching and the training loop's extent."""

    train_batch_size: int = Field(default=8, ge=1)
    """Effective groups (prompts) consumed per training step, over all consumers."""
    train_minibatch_size: int | None = Field(default=None, ge=1)
    """Groups per optimizer step; a train batch makes train_batch_size / train_minibatch_size
    optimizer steps. None means one optimizer step per train batch."""
    train_microbatch_size: int = Field(default=8, ge=1)
    """Sequences per forward/backward pass on one consumer (gradient accumulation; padded per
    micro-batch)."""
    train_microbatch_tokens: int | None = Field(default=None, ge=1)
    """Token budget of one forward/backward pass: rows × their padded length. When set, each
    optimizer step's rows are sorted by length and grouped longest first, up to this budget and
    at most ``train_microbatch_size`` rows, so short sequences are not padded to long ones (the
    gradient is the same sum). None: ``train_microbatch_size`` rows at a time in ticket order."""
    share_prompts: bool = True
    """Run each micro-batch's unique prompts through the model once and the G responses of each
    on top of its cached keys and values (the gradient flows through the cache), instead of G
    full prompt + response rows: the same log-probs and gradients, with the prompt's work done
    once per group (docs/performance.md). With ``algorithm.critic`` set every pass takes full
    rows (the value model does not take a cache), and so it does under context parallelism
    (``training.engine.context_parallel_size`` > 1, docs/scaling.md)."""
    packing: bool = False
    """Pack each micro-batch into a few rows without padding inside them: each unique prompt
    once, followed by its responses, one block per prompt, blocks placed largest first into rows
    as wide as the largest block; a block-causal mask lets each response token see its prompt and
    the earlier tokens of its own response only, positions restarting per response at the
    prompt's length. The same log-probs, loss and gradients as full rows, with the work of the
    tokens alone (no padding between responses, no repeated prompt). With
    ``train_microbatch_tokens`` set, that budget counts packed tokens and
    ``train_microbatch_size`` does not cap the rows; without it, micro-batches are
    ``train_microbatch_size`` rows in ticket order. Needs SDPA or eager attention; not with
    ``algorithm.critic`` or context parallelism, and ``share_prompts`` must stay true (packing
    shares the prompt). Opt-in: see docs/performance.md for when it wins."""
    max_steps: int | None = Field(default=None, ge=1)
    """Stop after this many training steps; None runs until the data ends."""
    logprob_chunk_size: int = Field(default=1024, ge=1)
    """Rows of logits turned into log-probs at once (bounds the float32 working set)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device of the consumer's model; ``auto`` picks CUDA when available."""
    engine: EngineConfig = Field(default_factory=SingleEngine)
    """How the ``launch.num_consumers`` consumers train together: ``single`` (one consumer),
    ``ddp`` or ``fsdp2``."""

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_shorthand(cls, value: Any) -> Any:
        return as_plugin_dict(value, SingleEngine)
