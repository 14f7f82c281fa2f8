"""``launch.local_ray=plain``: the demo trains on Ray exactly as it ships. While it runs, none of
zbrl's stand-ins is among the run's processes (no dashboard-agent stand-in, no fork server, no
``worker_exec`` in place of Ray's worker setup) and Ray's own dashboard agent is; the run's
output has no token-authentication notice."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers.cli_process import finish, start, tiny_run, trained_steps
from helpers.procs import descendants

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"
ZBRL_STAND_INS = ("agent_standin.py", "zbrl.launch.local_ray.forkserver", "worker_exec.py")


def command_lines(root: int) -> dict[int, str]:
    """The command line of ``root`` and of every process below it (scanning /proc)."""
    out = {}
    for pid in descendants(root):
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile
    return out


def test_plain_trains_the_demo_with_no_stand_in_process(tmp_path, run_cache):
    run_dir = tmp_path / "run"
    args = [*tiny_run(run_dir, run_cache, 4, 1), "launch.local_ray=plain"]
    proc, stderr = start(tmp_path, "run", "train", str(DEMO), *args)
    # every command line seen, of every process of the run: a process's line is '' once it
    # exits, so the lines are kept, not replaced per pid
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update(command_lines(proc.pid).values())
            time.sleep(0.2)
    finally:
        code, err = finish(proc, stderr, bound_s=60)
    assert code == 0, err[-3000:]
    assert trained_steps(run_dir) == 4
    ours = {c for c in seen if any(s in c for s in ZBRL_STAND_INS)}
    assert ours == set()
    assert any("dashboard/agent.py" in c for c in seen), sorted(seen)
    titles = sorted(c for c in seen if c.startswith("ray::"))
    assert any(c.startswith("ray::ConsumerWorker") for c in titles), titles
    out = err + (tmp_path / "run.stdout").read_text()
    assert "RAY_AUTH_MODE" not in out and "Token authentication" not in out, out[-3000:]
