"""A run at max_staleness=1 stopped with SIGTERM and resumed trains the same sample stream as an
uninterrupted run: with one producer and no filter drops, the same uids at the same steps, none
lost and none trained twice (the generating versions may differ: they depend on timing)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from helpers.cli_process import (
    finish,
    signal_stop,
    start,
    tiny_run,
    uid_log,
    wait_for_steps,
)
from zbrl.training.checkpoint import find_latest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"
STEPS = 16
NO_DROPS = ["algorithm.dynamic_batching=false", "algorithm.filter_truncated_response=false"]


def run_args(run_dir: Path, cache: Path) -> list[str]:
    return ["train", str(DEMO), *tiny_run(run_dir, cache, STEPS, 1), *NO_DROPS]


def test_stopped_and_resumed_at_staleness_1_trains_the_uninterrupted_stream(tmp_path, run_cache):
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    code, err = finish(*start(tmp_path, "straight", *run_args(straight, run_cache)))
    assert code == 0, err[-3000:]

    proc, stderr = start(tmp_path, "broken", *run_args(broken, run_cache))
    try:
        wait_for_steps(proc, stderr, broken, 5)
        signal_stop(proc, stderr, signal.SIGTERM)
    finally:
        code, err = finish(proc, stderr, bound_s=90)
    assert code == 143, err[-3000:]
    stopped_at = find_latest(broken / "checkpoints").version
    assert 5 <= stopped_at < STEPS
    code, err = finish(*start(tmp_path, "resumed", "resume", str(broken)))
    assert code == 0, err[-3000:]

    want, got = uid_log(straight), uid_log(broken)
    assert [x["step"] for x in got] == list(range(1, STEPS + 1))
    assert [x["uids"] for x in got] == [x["uids"] for x in want]  # same batches, same order
    uids = [u for x in got for u in x["uids"]]
    assert len(uids) == len(set(uids)) == 2 * STEPS
    for line in got:
        assert all(line["step"] - 1 - v <= 1 for v in line["policy_versions"]), line
