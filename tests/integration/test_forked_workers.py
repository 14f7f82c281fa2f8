"""A local Ray started by zbrl (``start_local_ray``) forks its workers from the fork server
(``zbrl.launch.worker_forkserver``): each worker is a child of the server with torch already
imported, in a process group of its own, behind a ``worker_exec`` stand-in that the raylet
started; killing one worker (by ``ray.kill``, or by its pid) leaves the others running, and the
server ends with the raylet."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]


def where_am_i_function():
    """A function defined here, so that Ray ships it by value (this test module is not
    importable in a worker)."""

    def where_am_i() -> dict:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_text().replace("\0", " ")
        return {"pid": os.getpid(), "parent": parent, "pgid": os.getpgid(0)}

    return where_am_i


def test_workers_are_forked_from_the_server_each_in_a_group_of_its_own():
    import ray

    where_am_i = where_am_i_function()

    @ray.remote
    class Probe:
        def where(self):
            return where_am_i()

    first, second = Probe.remote(), Probe.remote()
    a, b = ray.get([first.where.remote(), second.where.remote()], timeout=120)
    for seen in (a, b):
        assert "zbrl.launch.worker_forkserver" in seen["parent"]
        assert seen["pgid"] == seen["pid"]
    assert a["pid"] != b["pid"]
    # ray.kill ends a worker by signalling its process group: the other worker stays
    ray.kill(first, no_restart=True)
    time.sleep(1)
    assert ray.get(second.where.remote(), timeout=60)["pid"] == b["pid"]
    # a worker killed by its pid is seen dead by Ray, the others carry on
    third = Probe.remote()
    c = ray.get(third.where.remote(), timeout=120)
    os.kill(c["pid"], signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(third.where.remote(), timeout=60)
    assert ray.get(second.where.remote(), timeout=60)["pid"] == b["pid"]
    ray.kill(second, no_restart=True)


def test_a_task_with_its_own_variables_runs_in_a_fresh_worker():
    import ray

    where_am_i = where_am_i_function()

    @ray.remote(runtime_env={"env_vars": {"ZBRL_TEST_OWN": "1"}})
    def own():
        return where_am_i(), os.environ.get("ZBRL_TEST_OWN")

    seen, value = ray.get(own.remote(), timeout=120)
    assert value == "1"
    assert "zbrl.launch.worker_forkserver" not in seen["parent"]  # the raylet's own child
