"""Runs that survive: SIGINT/SIGTERM stop with a checkpoint, `zbrl resume` continues exactly, a
killed producer is restarted with nothing lost or trained twice.

Each test drives `zbrl` in a subprocess (its own session, so signals reach only it), talks only
to loopback, bounds every wait and kills whatever it started (kill_tree) however it ends."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.cli_process import finish, signal_stop, start, tiny_run, uid_log, wait_for_steps
from helpers.procs import descendants, find_process, kill_tree, survivors
from zbrl.training.checkpoint import find_latest, load_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


@pytest.fixture
def cache_dir(run_cache) -> Path:
    return run_cache


def run_to_end(tmp_path: Path, tag: str, *args: str) -> str:
    code, err = finish(*start(tmp_path, tag, *args))
    assert code == 0, err[-3000:]
    return err


def interrupt(tmp_path: Path, run_dir: Path, sig: int, at_step: int, *args: str) -> str:
    proc, stderr = start(tmp_path, "interrupted", *args)
    try:
        wait_for_steps(proc, stderr, run_dir, at_step)
        tree = descendants(proc.pid)  # the driver's Ray processes and workers
        sent = time.monotonic()
        signal_stop(proc, stderr, sig)
        code = proc.wait(timeout=60)
        took = time.monotonic() - sent
        left = survivors(tree, within_s=15)
    finally:
        kill_tree(proc)
    err = stderr.read_text()
    assert code == 128 + sig, err[-3000:]
    assert took < 30, f"the run took {took:.1f}s to stop"
    assert not left, f"processes of the run outlived it: {left}"
    assert f"continue with: zbrl resume {run_dir}" in err
    return err


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step-{step}" / "model.safetensors")


def test_sigint_then_resume_ends_bitwise_equal_to_the_uninterrupted_run(tmp_path, cache_dir):
    steps = 20
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    run_to_end(tmp_path, "straight", "train", str(DEMO), *tiny_run(straight, cache_dir, steps, 0))

    broken_args = tiny_run(broken, cache_dir, steps, 0)
    interrupt(tmp_path, broken, signal.SIGINT, 5, "train", str(DEMO), *broken_args)
    stopped_at = find_latest(broken / "checkpoints").version
    assert 5 <= stopped_at < steps
    summary = json.loads((broken / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and summary["steps"] == stopped_at
    run_to_end(tmp_path, "resumed", "resume", str(broken))

    want, got = weights(straight, steps), weights(broken, steps)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want), "resumed weights differ"
    assert [x["uids"] for x in uid_log(broken)] == [x["uids"] for x in uid_log(straight)]


def test_async_sigterm_and_resume_lose_nothing_and_train_nothing_twice(tmp_path, cache_dir):
    run_dir, staleness = tmp_path / "run", 2
    args = [*tiny_run(run_dir, cache_dir, 30, staleness), "launch.num_producers=2"]
    interrupt(tmp_path, run_dir, signal.SIGTERM, 6, "train", str(DEMO), *args)
    checkpoint = find_latest(run_dir / "checkpoints")
    buffered = {g.uid for g in load_state(checkpoint.buffer_file)["ready"].values()}
    before = {u for line in uid_log(run_dir) for u in line["uids"]}
    assert not buffered & before  # what the buffer held was not trained yet

    run_to_end(tmp_path, "resumed", "resume", str(run_dir), "training.max_steps=40")
    log = uid_log(run_dir)
    assert [x["step"] for x in log] == list(range(1, 41))
    trained = [u for line in log for u in line["uids"]]
    assert len(trained) == len(set(trained)), "a sample uid was trained twice"
    assert buffered <= set(trained), "admitted groups were lost across the interruption"
    for line in log:  # trained at version step-1 from weights at least step-1-staleness old
        assert all(line["step"] - 1 - v <= staleness for v in line["policy_versions"]), line


def test_killed_producer_and_evaluator_are_replaced_and_the_run_goes_on(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    evals = ["eval.max_prompts=8", "eval.interval=10", "eval.at_start=false"]
    args = [*(x for x in tiny_run(run_dir, cache_dir, 40, 1) if x != "eval.sets={}"), *evals]
    proc, stderr = start(tmp_path, "run", "train", str(DEMO), *args)
    try:
        wait_for_steps(proc, stderr, run_dir, 5)
        for name in ("ray::ProducerWorker", "ray::EvaluatorWorker"):
            pid = find_process(proc.pid, name)
            assert pid is not None, f"no {name} process in the run's tree"
            os.kill(pid, signal.SIGKILL)
    finally:
        code, err = finish(proc, stderr)
    assert code == 0, err[-3000:]
    assert "restarting producer-0 (1 of 3 restarts)" in err
    assert "failed (evaluator died" in err and "a new evaluator takes the next one" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["producer_restarts"] == 1 and summary["steps"] == 40
    assert summary["evaluator_failures"] == 1 and summary["eval_accuracy_final"] is not None
    trained = [u for line in uid_log(run_dir) for u in line["uids"]]
    assert len(trained) == len(set(trained)) == 80
    timeline = (run_dir / "timeline.jsonl").read_text()
    assert '"name": "restart"' in timeline


def test_past_the_restart_budget_the_run_ends_with_the_cause_and_a_checkpoint(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    args = [*tiny_run(run_dir, cache_dir, 100000, 1), "launch.max_producer_restarts=0"]
    proc, stderr = start(tmp_path, "run", "train", str(DEMO), *args)
    try:
        wait_for_steps(proc, stderr, run_dir, 3)
        os.kill(find_process(proc.pid, "ray::ProducerWorker"), signal.SIGKILL)
    finally:
        code, err = finish(proc, stderr)
    assert code == 1, err[-3000:]
    errors = [x for x in err.splitlines() if x.startswith("error:")]
    assert errors and errors[0].startswith("error: producer-0 died"), err[-3000:]
    assert f"continue with: zbrl resume {run_dir}" in err
    assert find_latest(run_dir / "checkpoints") is not None
