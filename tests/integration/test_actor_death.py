"""When a shared actor dies mid-run, the run's error names it, not the worker that noticed first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from endless_run import endless_tiny_run

from helpers.procs import find_process, kill_tree

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo.yaml"
BOUND_S = 300.0  # for each wait below; a normal pass takes well under a minute


def _training_under_way(metrics: Path) -> bool:
    if not metrics.is_file():
        return False
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return any("loss" in r for r in rows)


def test_a_killed_rollout_buffer_is_named_as_the_cause(tmp_path, run_cache):
    run_dir = tmp_path / "run"
    overrides = [*endless_tiny_run(run_dir, run_cache), "eval.sets={}"]
    stdout, stderr = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with open(stdout, "w") as out, open(stderr, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zbrl.cli", "train", str(DEMO), *overrides],
            stdout=out,
            stderr=err,
            cwd=tmp_path,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + BOUND_S
        while not _training_under_way(run_dir / "metrics.jsonl"):
            assert proc.poll() is None, f"the run ended early:\n{stderr.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.5)
        buffer_pid = find_process(proc.pid, "ray::RolloutBuffer")
        assert buffer_pid is not None, "no ray::RolloutBuffer process in the run's tree"
        os.kill(buffer_pid, signal.SIGKILL)
        returncode = proc.wait(timeout=BOUND_S)  # the run must end by itself
    finally:
        kill_tree(proc)
    errors = [x for x in stderr.read_text().splitlines() if x.startswith("error:")]
    assert returncode == 1, stderr.read_text()[-3000:]
    assert len(errors) == 1, stderr.read_text()[-3000:]
    message = errors[0]
    print(stderr.read_text()[-4000:])  # shown with pytest -s
    assert message.startswith("error: the rollout buffer actor died ("), message
    assert "as a consequence:" in message
    assert "weight store" not in message and "telemetry hub" not in message  # those are alive
