"""Starting Ray: a local cluster on loopback only (docs/cluster.md), or an existing cluster.

A local Ray binds every listening socket (GCS, raylet node manager and object manager, runtime-env
agent, the gRPC server of the driver and of every worker) to the node IP address it was started
with, but ``ray.init(_node_ip_address="127.0.0.1")`` replaces a loopback address by the machine's
external one unless ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` is false. Ray sets that
constant from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when ``ray`` is first imported, so setting the
variable later (or not at all) is not enough: :func:`loopback_only` sets both, whatever imported
``ray`` first, and puts them back after ``ray.init``. The processes Ray starts get their node IP
address on their command line and the variable through the environment they inherit.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator

from zbrl.config import RunConfig
from zbrl.errors import RunError
from zbrl.launch.ray_session import ray_in_own_session

LOOPBACK = "127.0.0.1"
# Read by Ray: the first at import (ray_constants.ENABLE_RAY_CLUSTER), the second by ray.init.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While inside: a local ``ray.init`` keeps 127.0.0.1 as the node IP address (see above).

    Afterwards the environment and Ray's constant are as the process had them, so a later
    ``ray.init(address=...)`` to a cluster in the same process behaves as without zbrl.
    """
    saved = {key: os.environ.get(key) for key in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    from ray._private import ray_constants  # a first import here reads the variable just set

    ray_constants.ENABLE_RAY_CLUSTER = False  # ray may have been imported before, with it unset
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(
            ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, not ray_constants.IS_WINDOWS_OR_OSX
        )


def required_cpus(cfg: RunConfig) -> float:
    la = cfg.launch
    return la.num_producers * la.producer_num_cpus + la.num_consumers * la.consumer_num_cpus


def init_ray(cfg: RunConfig) -> bool:
    """Start or connect to Ray; returns True when this call started it (and must shut it down)."""
    address = cfg.launch.ray_address or os.environ.get("RAY_ADDRESS")
    if address:  # a cluster: its own addresses and ports, nothing forced here
        import ray

        if ray.is_initialized():
            return False
        ray.init(address=address, log_to_driver=True)
        return True
    if _ray_running():  # the caller's own ray.init (a test session's Ray, say): used as it is
        return False
    start_local_ray(max(2, math.ceil(required_cpus(cfg)) + 1))
    return True


def start_local_ray(num_cpus: int) -> None:
    """Start a new local Ray instance with ``num_cpus`` CPUs (no GPU unless CUDA is there), every
    socket on loopback; raises RunError if Ray picked another address anyway."""
    num_gpus = 0 if not _has_cuda() else None
    with loopback_only(), ray_in_own_session():  # a group signal reaches the driver only
        import ray

        ray.init(
            address="local",  # a new local instance, never a `ray start` cluster found on disk
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            _node_ip_address=LOOPBACK,
            include_dashboard=False,
            dashboard_host=LOOPBACK,
            log_to_driver=True,
            logging_level="WARNING",
        )
    node_ip = ray.util.get_node_ip_address()
    if node_ip != LOOPBACK:
        ray.shutdown()
        raise RunError(
            f"the local Ray started on {node_ip} instead of {LOOPBACK}; a local run listens on "
            "loopback only (docs/cluster.md)"
        )


def _ray_running() -> bool:
    ray = sys.modules.get("ray")  # not imported: not running (and not imported here, see above)
    return ray is not None and ray.is_initialized()


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
