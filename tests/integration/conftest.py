"""One local Ray (loopback only, docs/cluster.md) for every run the integration tests make in
this process: ``run_training`` uses a Ray that is already up as it is, so the runs skip starting
and stopping their own. Runs in a subprocess (signals, killed workers, listening sockets) and the
multi-node cluster start their own, as a user's run does."""

from __future__ import annotations

import pytest

SHARED_RAY_CPUS = 3
"""What ``init_ray`` gives each of these runs when it starts Ray for it: its producers' and
consumers' CPUs (at most 2 here) plus one."""


@pytest.fixture(scope="package")
def local_ray():
    """A local Ray started once for this directory's tests that run in-process; shut down after
    the last of them."""
    import ray

    from zbrl.launch.ray_setup import start_local_ray

    start_local_ray(SHARED_RAY_CPUS)
    try:
        yield
    finally:
        ray.shutdown()
