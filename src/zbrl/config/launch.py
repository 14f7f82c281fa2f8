"""Topology and placement of the workers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from zbrl.config.base import Section
from zbrl.config.progress import NoProgress

PARALLEL_REPLACED = (
    "launch.parallel was replaced: data-parallel training is launch.num_consumers=M with "
    "training.engine=ddp (full replicas) or training.engine=fsdp2 (parameters and optimizer "
    "state sharded over the M consumers); remove launch.parallel"
)
TP_REFUSED = (
    "tensor parallelism of the trained model (launch.parallel.tp_size) is not supported; remove "
    "it and shard with training.engine=fsdp2 over launch.num_consumers instead"
)


class LaunchConfig(Section):
    """How many workers run where."""

    num_producers: int = Field(default=1, ge=1)
    """Rollout producers (each owns a disjoint shard of the prompts)."""
    num_consumers: int = Field(default=1, ge=1)
    """Training consumers: the ranks of one data-parallel process group (``training.engine``
    says how they share the model); each step's batch is split among them."""
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
    max_consumer_restarts: int = Field(default=3, ge=0)
    """Consumer processes that die are replaced this many times in all: every worker is
    re-created from the newest checkpoint (the whole data-parallel gang, the producers, the
    buffer) and the steps since that checkpoint are trained again; the next death ends the run."""
    stop_grace_s: float | None = Field(default=None, gt=0)
    """Seconds a stopping run (a signal, or a failure the consumer survives) waits for the
    consumer's stop checkpoint and for the roles to return. None sizes it from the run's own
    measurements: 2 x (the longest train step + the longest checkpoint write) + 20 s, with the
    write estimated from the policy's size on disk until one has been measured."""
    no_progress: NoProgress = Field(default_factory=NoProgress)
    """When a run that trains nothing stops (failed groups in a row, time without a step)."""
    torch_threads: int = Field(default=1, ge=1)
    """torch intra-op threads in each worker."""
    local_ray: Literal["fast", "plain"] | None = None
    """How a local Ray (no ``ray_address``) starts: ``plain`` is Ray exactly as it ships (its
    public settings only: no replaced Ray internals, no stand-in processes, no fork server);
    ``fast`` adds zbrl's replacements, which shorten a local start (the registry in
    ``launch/local_ray/registry.py``; docs/local-ray.md). None: ``fast`` when the installed
    Ray is within the tested range, else ``plain``. A cluster given by address is always
    ``plain``."""
    fork_workers: bool | None = None
    """With ``local_ray`` fast: fork the worker processes from one process that has imported
    torch and transformers while Ray started, instead of starting each afresh
    (``launch/local_ray/forkserver.py``). None: on where no CUDA GPU is visible, off where one
    is (not yet checked with CUDA: bench/gpu_check.py); true asks for it there too. Never used
    by ``local_ray=plain`` or a cluster."""
    lend_threads: bool = False
    """A lone consumer trains a step with the threads of the producers parked on its node for
    that whole step (admission has no room and no ticket is in flight: only the consumer's next
    version gives them work), up to the node's cores, and gives them back before it advances.
    Off: each worker keeps ``torch_threads``. Not used by data-parallel consumers. Off by
    default: on cores other jobs also use, more threads per worker can slow it down several
    times (docs/performance.md)."""

    @model_validator(mode="after")
    def _plain_has_no_fork_server(self) -> LaunchConfig:
        if self.local_ray == "plain" and self.fork_workers:
            raise ValueError(
                "launch.local_ray=plain is Ray as it ships, without the fork server, but "
                "launch.fork_workers=true asks for it; remove launch.fork_workers or use "
                "launch.local_ray=fast"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _refuse_parallel(cls, data: Any) -> Any:
        if isinstance(data, dict) and "parallel" in data:
            parallel = data["parallel"]
            tp = parallel.get("tp_size", 1) if isinstance(parallel, dict) else 1
            raise ValueError(TP_REFUSED if tp != 1 else PARALLEL_REPLACED)
        return data
