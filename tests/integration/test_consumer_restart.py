"""A consumer whose process dies (kill -9) is replaced: every worker is re-created from the newest
checkpoint, the steps since are trained again, and the run ends normally with
``consumer_restarts`` in its summary; the same for one rank of a data-parallel gang."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from helpers.cli_process import finish, start, tiny_run, uid_log, wait_for_steps
from helpers.procs import processes_named

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


def run_and_kill_a_consumer(tmp_path: Path, run_cache: Path, steps: int, kill_at: int, *extra: str):
    run_dir = tmp_path / "run"
    args = [*tiny_run(run_dir, run_cache, steps, 1), "logging.save_interval=5", *extra]
    proc, stderr = start(tmp_path, "run", "train", str(DEMO), *args)
    try:
        wait_for_steps(proc, stderr, run_dir, kill_at)
        pids = processes_named(proc.pid, "ray::ConsumerWorker")
        assert pids, "no consumer process in the run's tree"
        os.kill(pids[-1], signal.SIGKILL)
    finally:
        code, err = finish(proc, stderr)
    assert code == 0, err[-3000:]
    return run_dir, err


def check_the_run_went_on(run_dir: Path, err: str, steps: int) -> None:
    assert "restarting every worker from" in err and "(1 of 3 consumer restarts)" in err, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["consumer_restarts"] == 1 and summary["steps"] == steps
    log = uid_log(run_dir)
    assert [x["step"] for x in log] == list(range(1, steps + 1))  # each step once, in order
    trained = [u for line in log for u in line["uids"]]
    assert len(trained) == len(set(trained)), "a sample uid was trained twice"
    for line in log:  # the staleness bound (max_staleness=1) held across the restart
        assert all(line["step"] - 1 - v <= 1 for v in line["policy_versions"]), line
    assert '"name": "restart"' in (run_dir / "timeline.jsonl").read_text()
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("consumer_restarts") == 1.0 for m in metrics)
    assert [m["step"] for m in metrics if "train_reward" in m] == list(range(1, steps + 1))


def test_a_killed_consumer_is_restarted_from_the_checkpoint_and_the_run_goes_on(
    tmp_path, run_cache
):
    run_dir, err = run_and_kill_a_consumer(tmp_path, run_cache, steps=20, kill_at=8)
    check_the_run_went_on(run_dir, err, steps=20)


def test_a_killed_data_parallel_rank_restarts_the_whole_gang(tmp_path, run_cache):
    dp = [
        "launch.num_consumers=2",
        "training.engine=ddp",
        "launch.producer_num_cpus=0.5",
        "launch.consumer_num_cpus=0.5",
    ]
    run_dir, err = run_and_kill_a_consumer(tmp_path, run_cache, 14, 7, *dp)
    check_the_run_went_on(run_dir, err, steps=14)
