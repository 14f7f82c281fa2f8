"""One local Ray (loopback only, docs/cluster.md) per test module for the runs the integration
tests make in this process: ``run_training`` uses a Ray that is already up as it is, so those runs
skip starting and stopping their own. Runs in a subprocess (signals, killed workers, listening
sockets), the multi-node cluster and the planner's validation runs start their own, as a user's
run does."""

from __future__ import annotations

import pytest

SHARED_RAY_CPUS = 3
"""What ``init_ray`` gives each of these runs when it starts Ray for it: its producers' and
consumers' CPUs (at most 2 here) plus one."""


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray started once for a module's tests that run in-process, shut down after its
    last test (a module without this fixture, e.g. the planner's validation, gets no Ray left
    running by another)."""
    import ray

    from zbrl.launch.ray_setup import start_local_ray

    start_local_ray(SHARED_RAY_CPUS)
    try:
        yield
    finally:
        ray.shutdown()
