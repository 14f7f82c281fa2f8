"""The rollout buffer between producers and consumers, and weight sync back."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from zbrl.config.base import Section
from zbrl.config.plugin import as_plugin_dict, plugin_union


class ObjectStoreSync(Section):
    """Weights travel through the Ray object store (CPU and multi-node; the default)."""

    type: Literal["object_store"] = "object_store"
    """Weight-sync discriminator."""


class BroadcastSync(Section):
    """Weights travel over a torch.distributed group of their own (consumer rank 0 sends, every
    producer and the evaluator receive), flattened into buckets; see docs/scaling.md."""

    type: Literal["broadcast"] = "broadcast"
    """Weight-sync discriminator."""
    bucket_mb: float | None = Field(default=None, gt=0)
    """Size of one broadcast bucket in MiB (a version is sent as a flat byte stream in buckets
    of this size); None: 4 with gloo (fastest on loopback, bench/weight_sync.py), 64 with NCCL
    (each bucket passes through GPU memory; NCCL wants large messages)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Collective backend: ``auto`` is nccl when the consumers have GPUs, gloo otherwise."""
    address: str | None = None
    """Address the sender (consumer rank 0) listens on for the group; None: its node's Ray
    address (127.0.0.1 in a local run). Producers and the evaluator must reach it. The group's
    rendezvous goes through the run's WeightStore actor, so no fixed port is needed."""
    join_timeout_s: float = Field(default=120.0, gt=0)
    """Seconds to wait for every member to join a (re)formed group."""
    op_timeout_s: float = Field(default=300.0, gt=0)
    """Seconds a single bucket broadcast may take before the group is declared broken."""


class CudaIpcSync(Section):
    """Weights pass as CUDA IPC handles to every producer (and the evaluator) whose process sees
    the consumer's GPU on the same machine (e.g. both on one GPU with fractional
    ``launch.producer_num_gpus`` / ``consumer_num_gpus``); any other receiver, and every receiver
    when the consumer trains on CPU, gets them through the object store, with one log line
    saying why. See docs/scaling.md, "The same-GPU handoff"."""

    type: Literal["cuda_ipc"] = "cuda_ipc"
    """Weight-sync discriminator."""
    bucket_mb: float = Field(default=256.0, gt=0)
    """Largest shared CUDA buffer in MiB: a version is cast to the inference dtype into flat
    buffers of whole tensors, at most this large (one larger tensor gets its own), each shared
    by one IPC handle."""
    buffers: int = Field(default=2, ge=2)
    """Sets of shared buffers the consumer keeps (each one copy of the weights in the inference
    dtype, in the consumer's GPU memory): a version is written into a set no receiver is still
    reading, so training waits only when every set is held."""
    release_timeout_s: float = Field(default=120.0, gt=0)
    """Seconds ``publish`` waits for a receiver to release a buffer set before the consumer
    fails naming it (receivers whose process is gone are released at once)."""


WeightSyncConfig = plugin_union(ObjectStoreSync, BroadcastSync, CudaIpcSync)
"""How new weights reach the producers and the evaluator."""


class TransportConfig(Section):
    """Buffering and staleness control."""

    max_staleness: int = Field(default=1, ge=0)
    """A sample trained at policy version v was generated at version >= v - max_staleness;
    0 is the synchronous on-policy baseline."""
    buffer_capacity: int | None = Field(default=None, ge=1)
    """Groups the buffer holds at most; None derives it from the staleness rule."""
    weight_sync: WeightSyncConfig = Field(default_factory=ObjectStoreSync)
    """How new weights reach the producers."""

    @field_validator("weight_sync", mode="before")
    @classmethod
    def _weight_sync_shorthand(cls, value: Any) -> Any:
        return as_plugin_dict(value, ObjectStoreSync)
