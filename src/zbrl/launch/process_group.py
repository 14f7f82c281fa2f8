"""The consumers' process group as the driver sets it up: where its rendezvous store listens
(this, the head node's, address: loopback in local runs) and which backend it uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zbrl.config import RunConfig

if TYPE_CHECKING:  # torch.distributed, imported only when there is a group (a lone consumer's
    # driver starts without torch: docs/performance.md, Start-up)
    from zbrl.training.distributed import GroupHost, GroupSpec


def consumer_group(cfg: RunConfig) -> tuple[GroupHost | None, GroupSpec | None]:
    """The rendezvous store (keep it alive for the run) and the spec each consumer joins with;
    ``(None, None)`` for one consumer, unless its engine is FSDP2 (one rank that offloads to the
    host: ``fully_shard`` needs a process group, of one)."""
    la = cfg.launch
    if la.num_consumers == 1 and cfg.training.engine.type != "fsdp2":
        return None, None
    from zbrl.training.distributed import GroupHost, resolve_backend

    requested = getattr(cfg.training.engine, "backend", "auto")
    backend = resolve_backend(requested, la.consumer_num_gpus)
    host = GroupHost(head_address(cfg))
    return host, host.spec(la.num_consumers, backend)


def head_address(cfg: RunConfig) -> str:
    """127.0.0.1 for a local run (everything on loopback); this node's address in a cluster."""
    if cfg.launch.ray_address is None:
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address()
