"""A local run listens on loopback only: every process it starts, every listening socket.

The run (``zbrl train``, or the Python API in a process that imported ray first) is a subprocess
in its own session, without the Ray variables that the Makefile and conftest set, so the check
covers what zbrl itself does. While it runs, the test reads the run's process tree from /proc and
maps the LISTEN sockets of /proc/net/tcp{,6} to those processes through the socket inodes in
/proc/PID/fd.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from endless_run import endless_tiny_run

from helpers.procs import is_loopback, kill_tree, listeners_of

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo.yaml"
# what a local run starts, by the start of the process's command line (Ray names actor processes
# ray::ClassName); every one of them must have been seen listening before the test concludes
EXPECTED = (
    "python",  # the driver
    "gcs_server",
    "raylet",
    "ray::RolloutBuffer",
    "ray::WeightStore",
    "ray::TelemetryHub",
    "ray::ProducerWorker",
    "ray::ConsumerWorker",
    "ray::EvaluatorWorker",
    "ray::RuntimeEnvAgent",
)
RAY_VARIABLES = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED")
POLLS_AFTER_ALL_SEEN = 5
BOUND_S = 420.0  # upper bound on the whole test; a normal pass takes well under a minute


@pytest.mark.slow
def test_local_run_listens_on_loopback_only(tmp_path, run_cache):
    overrides = [*endless_tiny_run(tmp_path / "run", run_cache), "eval.max_prompts=2"]
    command = [sys.executable, "-m", "zbrl.cli", "train", str(DEMO), *overrides]
    check_listeners(command, tmp_path, EXPECTED)


# The Python API, in a process that imported ray before zbrl (so Ray read its environment, without
# the loopback variable, before zbrl could set it); it holds Ray up until its stdin closes.
API_SCRIPT = """
import sys

import ray

from zbrl.config import load_config
from zbrl.launch.ray_setup import init_ray

assert init_ray(load_config(sys.argv[1], []))


@ray.remote(num_cpus=0)
class Pinger:
    def ping(self):
        return "pong"


pinger = Pinger.remote()
assert ray.get(pinger.ping.remote(), timeout=300) == "pong"
sys.stdin.read()
"""


def test_python_api_after_an_early_import_of_ray_listens_on_loopback_only(tmp_path):
    command = [sys.executable, "-c", API_SCRIPT, str(DEMO)]
    expected = ("python", "gcs_server", "raylet", "ray::RuntimeEnvAgent", "ray::Pinger")
    check_listeners(command, tmp_path, expected)


def check_listeners(command: list[str], tmp_path: Path, expected: tuple[str, ...]) -> None:
    """Start ``command`` without the Ray variables that the Makefile and conftest set, watch its
    process tree's listening sockets until every ``expected`` process was seen listening (and a
    few polls more), then end it; every socket seen must be bound to loopback."""
    env = {k: v for k, v in os.environ.items() if k not in (*RAY_VARIABLES, "RAY_ADDRESS")}
    log = tmp_path / "process.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,  # its own process group: killed as a whole below
        )
    seen: set[tuple[str, str, int]] = set()
    polls_after_all_seen = 0
    deadline = time.monotonic() + BOUND_S
    try:
        while polls_after_all_seen < POLLS_AFTER_ALL_SEEN and time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            seen |= listeners_of(proc.pid)
            if not _missing(expected, seen):
                polls_after_all_seen += 1
            time.sleep(0.5)
        alive = proc.poll() is None
    finally:
        kill_tree(proc)
    output = log.read_text()[-3000:]
    print("listeners seen:", *sorted(seen), sep="\n  ")  # shown with pytest -s
    assert alive, f"the process ended before it was inspected:\n{output}"
    missing = _missing(expected, seen)
    assert not missing, f"never saw {missing} listening; seen: {sorted(seen)}\n{output}"
    assert len(seen) >= len(expected) + 1  # the raylet has two ports
    wide = sorted(s for s in seen if not is_loopback(s[1]))
    assert not wide, f"listening beyond loopback: {wide}"


def _missing(expected: tuple[str, ...], seen: set[tuple[str, str, int]]) -> list[str]:
    names = {name for name, _, _ in seen}
    return [e for e in expected if not any(n.startswith(e) for n in names)]
