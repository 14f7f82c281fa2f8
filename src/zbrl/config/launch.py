"""Topology and placement of the workers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from zbrl.config.base import Section


class ParallelConfig(Section):
    """Parallelism of the training consumers."""

    dp_size: int = Field(default=1, ge=1)
    """Data-parallel replicas (one consumer each)."""
    fsdp_size: int = Field(default=1, ge=1)
    """FSDP shard group size inside each data-parallel replica."""
    tp_size: int = Field(default=1, ge=1)
    """Tensor-parallel degree of the trained model."""


class LaunchConfig(Section):
    """How many workers run where."""

    num_producers: int = Field(default=1, ge=1)
    """Rollout producers (each owns a disjoint shard of the prompts)."""
    num_consumers: int = Field(default=1, ge=1)
    """Training consumers."""
    ray_address: str | None = None
    """Address of an existing Ray cluster (``HOST:PORT`` of its head, as ``ray start --head``
    prints it); None starts a local one on loopback. See docs/scaling.md."""
    producer_num_cpus: float = Field(default=1.0, gt=0)
    """CPUs reserved per producer."""
    consumer_num_cpus: float = Field(default=1.0, gt=0)
    """CPUs reserved per consumer."""
    producer_num_gpus: float = Field(default=0.0, ge=0)
    """GPUs per producer (0 on CPU-only machines)."""
    consumer_num_gpus: float = Field(default=0.0, ge=0)
    """GPUs per consumer (0 on CPU-only machines)."""
    placement: Literal["pack", "spread"] = "pack"
    """How producers are placed on the cluster's nodes: ``pack`` fills as few nodes as possible,
    ``spread`` puts them on as many as possible. Consumers are always packed together (their
    training group talks most)."""
    placement_timeout_s: float = Field(default=120.0, gt=0)
    """Seconds to wait for the cluster to grant the workers' resources before failing."""
    max_producer_restarts: int = Field(default=3, ge=0)
    """Producers that die (their process is gone) are re-created this many times in all; the
    next death ends the run, leaving a resumable checkpoint."""
    torch_threads: int = Field(default=1, ge=1)
    """torch intra-op threads in each worker."""
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    """Training parallelism."""
