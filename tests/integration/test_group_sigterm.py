"""SIGTERM to the run's whole process group (what `timeout`, `kill -- -PGID` and a job
scheduler's process-group kill send) stops the run as SIGTERM to the driver alone does: the
stop checkpoint is written and the run exits 143 within 30 s. Ray's processes run in a session
of their own, so the signal reaches only the driver."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from helpers.cli_process import finish, start, tiny_run, wait_for_steps
from helpers.procs import descendants, process_name, survivors
from zbrl.training.checkpoint import find_latest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


def test_sigterm_to_the_process_group_ends_with_a_resumable_checkpoint(tmp_path, run_cache):
    run_dir = tmp_path / "run"
    args = [*tiny_run(run_dir, run_cache, 100000, 1), "launch.stop_grace_s=45"]
    proc, stderr = start(tmp_path, "run", "train", str(DEMO), *args)
    try:
        wait_for_steps(proc, stderr, run_dir, 3)
        tree = descendants(proc.pid) - {proc.pid}  # Ray's processes and the workers
        ray_processes = {process_name(p) for p in tree}
        assert any(n.startswith("ray::ConsumerWorker") for n in ray_processes), ray_processes
        os.killpg(proc.pid, signal.SIGTERM)  # the driver's group: the test started it as leader
        sent = time.monotonic()
        code = proc.wait(timeout=90)
        took = time.monotonic() - sent
        left = survivors(tree, within_s=15)
    finally:
        code, err = finish(proc, stderr)
    assert code == 143, err[-3000:]
    assert took < 30, f"the run took {took:.1f}s to stop"
    assert not left, f"processes of the run outlived it: {left}"
    checkpoint = find_latest(run_dir / "checkpoints")
    assert checkpoint is not None and checkpoint.version >= 3, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] == "SIGTERM"
    assert summary["checkpoint"] == str(checkpoint.path)
    assert f"continue with: zbrl resume {run_dir}" in err
    assert "waiting up to 45s for the current step and the stop checkpoint" in err  # the setting
