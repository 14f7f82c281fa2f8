"""The loopback Ray clusters of the multi-node tests (``tests/integration/loopback_cluster.py``,
every node on 127.0.0.1), started in a process of their own and ended with everything they
started, however the test ends."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from helpers.procs import descendants, kill_tree, process_name

CLUSTER_SCRIPT = Path(__file__).resolve().parents[1] / "integration" / "loopback_cluster.py"


def start_cluster(args: list[str], log: Path) -> subprocess.Popen:
    """``loopback_cluster.py ARGS`` in a session of its own: it answers on stdout (a JSON line
    once up), its stderr goes to ``log``, and closing its stdin shuts its cluster down."""
    with open(log, "w") as err:
        return subprocess.Popen(
            [sys.executable, str(CLUSTER_SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )


def read_answer(proc: subprocess.Popen, timeout: float) -> str:
    """The cluster process's next line on stdout; AssertionError after ``timeout`` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no answer from the cluster process within {timeout}s"
    return proc.stdout.readline()


def stop_tree(proc: subprocess.Popen) -> None:
    """End ``proc`` (a session of its own): close its input (a cluster process then shuts its
    nodes down) and wait for it, then kill what is left of its tree, by pid and name (a pid reused
    by another program is left alone)."""
    started = {pid: process_name(pid) for pid in descendants(proc.pid)}
    if proc.stdin is not None:
        proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=60)
    kill_tree(proc)
    for pid, name in started.items():  # anything that outlived it
        if process_name(pid) == name:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
