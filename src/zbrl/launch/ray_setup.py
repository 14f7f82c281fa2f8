"""Starting Ray: a local cluster on loopback only (DESIGN §5), or an existing cluster."""

from __future__ import annotations

import math
import os

from zbrl.config import RunConfig

LOOPBACK = "127.0.0.1"


def loopback_env() -> None:
    """Environment that keeps a local Ray on 127.0.0.1 (must be set before ``ray.init``)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"


def required_cpus(cfg: RunConfig) -> float:
    la = cfg.launch
    return la.num_producers * la.producer_num_cpus + la.num_consumers * la.consumer_num_cpus


def init_ray(cfg: RunConfig) -> bool:
    """Start or connect to Ray; returns True when this call started it (and must shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    address = cfg.launch.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return True
    loopback_env()
    cpus = max(2, math.ceil(required_cpus(cfg)) + 1)
    ray.init(
        num_cpus=cpus,
        num_gpus=0 if not _has_cuda() else None,
        _node_ip_address=LOOPBACK,
        include_dashboard=False,
        log_to_driver=True,
        logging_level="WARNING",
    )
    return True


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
