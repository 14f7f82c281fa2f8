"""A local Ray started by zbrl (``start_local_ray``) forks its workers from the fork server
(``zbrl.launch.local_ray.forkserver``): each worker is a child of the server with torch already
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
        assert "zbrl.launch.local_ray.forkserver" in seen["parent"]
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
    assert "zbrl.launch.local_ray.forkserver" not in seen["parent"]  # the raylet's own child


def test_the_raylets_dashboard_agent_is_zbrls_stand_in_with_its_ports_not_in_use():
    """With Ray's minimal install the raylet runs ``local_ray.agent_standin`` as its dashboard agent
    (``idle_agent_replaced``): a child of the raylet that has written -1 to the three port
    files Ray's agent writes, and Ray came up with it (this module's other tests ran on it)."""
    import ray
    from ray._private import ray_constants
    from ray._private.worker import _global_node
    from ray._raylet import (
        DASHBOARD_AGENT_LISTEN_PORT_NAME,
        METRICS_AGENT_PORT_NAME,
        METRICS_EXPORT_PORT_NAME,
        get_port_filename,
    )

    raylet = _global_node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    commands = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == raylet:
                commands.append((stat.parent / "cmdline").read_text().split("\0"))
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    stand_ins = [c for c in commands if any(a.endswith("agent_standin.py") for a in c)]
    assert len(stand_ins) == 1, commands
    session = _global_node.get_session_dir_path()
    node = ray.get_runtime_context().get_node_id()
    for name in (
        METRICS_AGENT_PORT_NAME,
        METRICS_EXPORT_PORT_NAME,
        DASHBOARD_AGENT_LISTEN_PORT_NAME,
    ):
        path = Path(session, get_port_filename(node, name))
        assert path.read_text() == "-1"
        assert str(path) in stand_ins[0]
