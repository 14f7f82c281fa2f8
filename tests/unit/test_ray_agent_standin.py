"""zbrl's stand-in for Ray's idle dashboard agent (``zbrl.launch.local_ray.agent_standin``), the
raylet command that starts it (``local_ray.replacements.idle_agent_replaced``) and Ray's
dashboard test that looks for packages before importing them
(``local_ray.replacements.quick_dashboard_check``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from zbrl.launch.local_ray import agent_standin as ray_agent_standin
from zbrl.launch.local_ray import replacements as ray_session

STAND_IN = ray_agent_standin.__file__


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_it_writes_not_in_use_to_each_port_file_and_ends_when_its_parent_does(tmp_path):
    """A parent (standing for the raylet) starts the stand-in and stays: the files hold -1 and
    the stand-in lives on; once the parent is killed, the stand-in ends by itself."""
    files = [tmp_path / "metrics_agent_port_x", tmp_path / "dashboard_agent_listen_port_x"]
    parent_code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-S", {STAND_IN!r}, *sys.argv[1:]])
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != ray_agent_standin.RAYLET_PID_ENV}
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code, *map(str, files)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        child = int(parent.stdout.readline())
        assert _wait_for(lambda: all(f.exists() for f in files), 10)
        assert [f.read_text() for f in files] == ["-1", "-1"]
        assert not list(tmp_path.glob("*.tmp"))  # written whole, by rename
        time.sleep(1.2)  # two polls
        assert _alive(child)
        parent.kill()
        parent.wait(timeout=10)
        assert _wait_for(lambda: not _alive(child), 5), "the stand-in outlived its raylet"
    finally:
        parent.kill()
        parent.wait(timeout=10)


def test_a_raylet_gone_before_it_looked_ends_it_at_once(tmp_path):
    """The raylet's pid comes from ``RAY_RAYLET_PID``: when that is not the parent (the raylet
    ended before the stand-in began), it writes its files and returns."""
    done = subprocess.run(
        [sys.executable, "-S", STAND_IN, str(tmp_path / "port")],
        env={**os.environ, ray_agent_standin.RAYLET_PID_ENV: "999999999"},
        timeout=30,
    )
    assert done.returncode == 0
    assert (tmp_path / "port").read_text() == "-1"


def _agent_command(*extra: str) -> str:
    node = "ab" * 28
    return subprocess.list2cmdline(
        [
            "/usr/bin/python",
            "/ray/dashboard/agent.py",
            f"--node-id={node}",
            "--session-dir=/tmp/ray/session 1",
            "--grpc-port=0",
            *extra,
        ]
    )


def test_a_minimal_agent_is_replaced_in_the_raylets_command_and_any_other_left(monkeypatch):
    from ray._private import services
    from ray._raylet import METRICS_AGENT_PORT_NAME, get_port_filename

    started = []

    def start_ray_process(command, process_type, **kwargs):
        started.append(command)

    monkeypatch.setattr(services, "start_ray_process", start_ray_process)
    flag = ray_session.DASHBOARD_AGENT_FLAG
    with ray_session.idle_agent_replaced() as active:
        assert active
        services.start_ray_process(["raylet", f"{flag}{_agent_command('--minimal')}"], "raylet")
        services.start_ray_process(["raylet", f"{flag}{_agent_command()}"], "raylet")
    assert services.start_ray_process is start_ray_process
    replaced, kept = started
    assert kept == ["raylet", f"{flag}{_agent_command()}"]
    stand_in = shlex.split(replaced[1][len(flag) :])
    assert stand_in[:3] == [sys.executable, "-S", STAND_IN]
    assert len(stand_in) == 6  # three port files
    expected = os.path.join(
        "/tmp/ray/session 1", get_port_filename("ab" * 28, METRICS_AGENT_PORT_NAME)
    )
    assert expected in stand_in


def test_imported_packages_are_the_top_level_names_in_order(tmp_path):
    listing = tmp_path / "deps.py"
    listing.write_text(
        "import aiohttp\nimport aiohttp.web\nimport grpc, json\n"
        "from aiohttp import x\nfrom . import y\n"
    )
    assert ray_session.imported_packages(str(listing)) == ["aiohttp", "grpc", "json"]


def test_a_missing_dashboard_package_is_found_without_importing_ray_s_list(monkeypatch):
    """Ray's test imports ``ray.dashboard.optional_deps``; the quick one answers an ImportError
    naming the first package not installed and calls Ray's only when every one is there."""
    from ray._private import utils

    calls = []

    def rays_own():
        calls.append(1)
        return None

    monkeypatch.setattr(utils, "get_dashboard_dependency_error", rays_own)
    monkeypatch.setattr(ray_session, "imported_packages", lambda path: ["json", "zbrl_no_such_pkg"])
    with ray_session.quick_dashboard_check() as active:
        assert active
        error = utils.get_dashboard_dependency_error()
    assert isinstance(error, ImportError) and error.name == "zbrl_no_such_pkg"
    assert calls == []
    assert utils.get_dashboard_dependency_error is rays_own
    monkeypatch.setattr(ray_session, "imported_packages", lambda path: ["json", "os"])
    with ray_session.quick_dashboard_check():
        assert utils.get_dashboard_dependency_error() is None
    assert calls == [1]


def test_rays_own_listing_is_read():
    """The list is Ray's own file: here (minimal install) a package of it is missing, as Ray's
    import-everything test also says."""
    import ray
    from ray._private import utils

    listing = os.path.join(os.path.dirname(ray.__file__), "dashboard", "optional_deps.py")
    names = ray_session.imported_packages(listing)
    assert "aiohttp" in names and "pydantic" in names
    with ray_session.quick_dashboard_check():
        quick = utils.get_dashboard_dependency_error()
    assert (quick is None) == (utils.get_dashboard_dependency_error() is None)
