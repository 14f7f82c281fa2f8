"""Where a run's workers go: Ray placement groups built from ``launch.*`` resources.

Producers get one placement group with a bundle per producer (``launch.producer_num_cpus`` /
``producer_num_gpus`` each), strategy PACK or SPREAD from ``launch.placement``; consumers get one
group of their own, always PACK, so a data-parallel training group sits on as few nodes as the
cluster allows. Both are reserved (and waited for, with a clear error when the cluster cannot
grant them) before any worker starts. The shared actors (rollout buffer, weight store, telemetry
hub: no resources) are pinned to the node of the driver, the head in a cluster run, so losing a
worker node never takes them with it. The evaluator needs no reserved CPU and goes where Ray puts
it (with NCCL weight sync it takes a producer's GPUs). Reward workers (``reward.workers``) that
reserve CPUs or GPUs get a SPREAD group of their own, reserved with the others: a worker the
cluster cannot place is an error at start naming the fields to change, never a batch that waits
for a worker that never starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbrl.config import RunConfig
from zbrl.errors import RunError


@dataclass
class Placement:
    """The reserved placement groups of a run and the actor options that use them."""

    producers: Any
    consumers: Any
    driver_node: str
    cfg: RunConfig
    reward_workers: Any = None
    """The reward workers' group (None: no reward workers, or workers that reserve nothing)."""

    def producer_options(self, index: int) -> dict[str, Any]:
        la = self.cfg.launch
        return _in_bundle(self.producers, index, la.producer_num_cpus, la.producer_num_gpus)

    def consumer_options(self, index: int) -> dict[str, Any]:
        la = self.cfg.launch
        return _in_bundle(self.consumers, index, la.consumer_num_cpus, la.consumer_num_gpus)

    def reward_worker_options(self, index: int) -> dict[str, Any]:
        """Reward worker ``index``'s resources, in its bundle when it reserves any."""
        cpus, gpus = reward_worker_resources(self.cfg)
        if self.reward_workers is None:
            return {"num_cpus": cpus, "num_gpus": gpus}
        return _in_bundle(self.reward_workers, index, cpus, gpus)

    def evaluator_options(self) -> dict[str, Any]:
        from zbrl.assembly.shared_settings import weight_sync_backend

        gpus = self.cfg.launch.producer_num_gpus if weight_sync_backend(self.cfg) == "nccl" else 0
        return {"num_cpus": 0, "num_gpus": gpus}

    def shared_options(self) -> dict[str, Any]:
        """A shared actor (no resources) on the driver's node."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = NodeAffinitySchedulingStrategy(node_id=self.driver_node, soft=False)
        return {"num_cpus": 0, "scheduling_strategy": strategy}

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in (self.producers, self.consumers, self.reward_workers):
            if pg is None:
                continue
            with contextlib.suppress(Exception):  # Ray is going down with the run
                remove_placement_group(pg)


def reward_worker_resources(cfg: RunConfig) -> tuple[float, float]:
    """(CPUs, GPUs) each reward worker reserves."""
    from zbrl.config import RewardModelReward

    rw = cfg.reward
    assert isinstance(rw, RewardModelReward)
    return rw.worker_num_cpus, rw.worker_num_gpus


def reward_worker_count(cfg: RunConfig) -> int:
    """The run's reward workers (``reward.workers`` of a ``reward_model`` reward, else 0)."""
    from zbrl.config import RewardModelReward

    return cfg.reward.workers if isinstance(cfg.reward, RewardModelReward) else 0


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {})}


def _in_bundle(pg: Any, index: int, cpus: float, gpus: float) -> dict[str, Any]:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index
    )
    return {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": strategy}


def reserve(cfg: RunConfig) -> Placement:
    """Reserve the producers' and consumers' resources; RunError naming the fields to change
    when the cluster cannot grant them within ``launch.placement_timeout_s``."""
    import ray
    from ray.util.placement_group import placement_group

    la = cfg.launch
    groups = {
        "producers": placement_group(
            [_bundle(la.producer_num_cpus, la.producer_num_gpus)] * la.num_producers,
            strategy="SPREAD" if la.placement == "spread" else "PACK",
        ),
        "consumers": placement_group(
            [_bundle(la.consumer_num_cpus, la.consumer_num_gpus)] * la.num_consumers,
            strategy="PACK",
        ),
    }
    rewards = ""
    workers = reward_worker_count(cfg)
    if workers and any(r > 0 for r in reward_worker_resources(cfg)):
        bundle = _bundle(*reward_worker_resources(cfg))
        groups["reward_workers"] = placement_group([bundle] * workers, strategy="SPREAD")
        rewards = f" and {workers} x {bundle} (reward workers)"
    placement = Placement(
        groups["producers"], groups["consumers"], ray.get_runtime_context().get_node_id(), cfg,
        reward_workers=groups.get("reward_workers"),
    )  # fmt: skip
    ready, _ = ray.wait(
        [pg.ready() for pg in groups.values()],
        num_returns=len(groups),
        timeout=la.placement_timeout_s,
    )
    if len(ready) < len(groups):
        placement.remove()
        fix = "Lower launch.num_producers / num_consumers or *_num_cpus / *_num_gpus"
        if rewards:
            fix += ", reward.workers or reward.worker_num_cpus / worker_num_gpus (or score in "
            fix += "the producers: reward.workers=0)"
        raise RunError(
            f"the cluster did not grant the workers' resources within "
            f"launch.placement_timeout_s={la.placement_timeout_s}s: needed "
            f"{la.num_producers} x {_bundle(la.producer_num_cpus, la.producer_num_gpus)} "
            f"(producers, {la.placement}), {la.num_consumers} x "
            f"{_bundle(la.consumer_num_cpus, la.consumer_num_gpus)} (consumers, packed)"
            f"{rewards}; the cluster has {_plain(ray.cluster_resources())} in all, "
            f"{_plain(ray.available_resources())} free. {fix}, or add nodes"
        )
    return placement


def _plain(resources: dict[str, float]) -> dict[str, float]:
    """CPU and GPU counts (not Ray's per-placement-group and per-node entries)."""
    return {k: resources[k] for k in ("CPU", "GPU") if k in resources}


def describe_process() -> dict[str, Any]:
    """Where the calling worker runs (called inside the worker's process)."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def node_address() -> str:
    """This worker's node IP address (the broadcast sender's default rendezvous address)."""
    import ray

    return ray.util.get_node_ip_address()


WORKERS_FILE = "workers.json"


def record_placement(cfg: RunConfig, workers: Any, run_dir: Path, timeout_s: float = 60.0) -> None:
    """Ask every worker where it runs (``workers``: a spawn.Workers); kept in ``workers.where``
    for summary.json and written to RUN_DIR/workers.json at once, so a running run shows where
    everything is."""
    from zbrl.launch.failures import RunFailed, outcome_of

    la = cfg.launch
    eval_gpus = workers.placement.evaluator_options()["num_gpus"] if workers.placement else 0
    resources = {
        "producer": (la.producer_num_cpus, la.producer_num_gpus),
        "consumer": (la.consumer_num_cpus, la.consumer_num_gpus),
        "evaluator": (0.0, float(eval_gpus)),
    }
    refs = {a.placement.remote(): name for a, name in workers.names.items()}
    where = []
    for ref, name in refs.items():
        kind, info = outcome_of(ref, name, timeout_s)
        if kind != "ok":
            raise RunFailed(info)
        role = name.split("-")[0]
        cpus, gpus = resources[role]
        where.append({"name": name, "role": role, **info, "num_cpus": cpus, "num_gpus": gpus})
    workers.where = sorted(where, key=lambda w: w["name"])
    (run_dir / WORKERS_FILE).write_text(json.dumps(workers.where, indent=2) + "\n")
