"""Driving ``zbrl`` as a user does, for the slow end-to-end tests: in a subprocess with its own
session (so a signal sent to its process group reaches only the run), every wait bounded, and
everything it started killed however the test ends (:func:`helpers.procs.kill_tree`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from helpers.procs import kill_tree, processes_named
from helpers.runs import WARM_START_STEPS

BOUND_S = 300.0
"""Longest wait for any one thing (a run's start, its steps, its end)."""


def tiny_run(run_dir: Path, cache_dir: Path, steps: int, staleness: int) -> list[str]:
    """Overrides of the demo recipe for a run of a fraction of a second a step on 2 cores
    (``cache_dir``: the tests' shared ``run_cache``, whose warm start they all reuse)."""
    return [
        f"logging.run_dir={run_dir}",
        f"logging.cache_dir={cache_dir}",
        "logging.progress=false",
        "logging.save_interval=0",
        f"model.warm_start.steps={WARM_START_STEPS}",
        "data.synthetic.num_train=64",
        "data.num_epochs=100",
        "rollout.generation.max_new_tokens=8",
        "rollout.generation.num_generations=2",
        "rollout.inference_batch_size=2",
        "rollout.inference_microbatch_size=2",
        "training.train_batch_size=2",
        "training.train_microbatch_size=4",
        f"training.max_steps={steps}",
        f"transport.max_staleness={staleness}",
        "eval.sets={}",
        "seed=7",
    ]


def start(workdir: Path, tag: str, *args: str) -> tuple[subprocess.Popen, Path]:
    """``python -m zbrl.cli ARGS`` in a new session (its pid is its process group's id);
    stdout and stderr go to ``workdir/TAG.stdout`` and ``TAG.stderr``."""
    stderr = workdir / f"{tag}.stderr"
    with open(workdir / f"{tag}.stdout", "w") as out, open(stderr, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zbrl.cli", *args],
            stdout=out,
            stderr=err,
            cwd=workdir,
            start_new_session=True,
        )
    return proc, stderr


def finish(proc: subprocess.Popen, stderr: Path, bound_s: float = BOUND_S) -> tuple[int, str]:
    """Wait for the run to end (at most ``bound_s``), kill what is left, return its exit status
    and stderr."""
    try:
        code = proc.wait(timeout=bound_s)
    finally:
        kill_tree(proc)
    return code, stderr.read_text()


def trained_steps(run_dir: Path) -> int:
    """Lines in the run's ``trained_uids.jsonl`` (one per step trained)."""
    log = run_dir / "trained_uids.jsonl"
    return len(log.read_text().splitlines()) if log.is_file() else 0


def wait_for_steps(proc: subprocess.Popen, stderr: Path, run_dir: Path, steps: int) -> None:
    """Until the run has trained ``steps`` steps; AssertionError if it ends or stalls first."""
    deadline = time.monotonic() + BOUND_S
    while trained_steps(run_dir) < steps:
        assert proc.poll() is None, f"the run ended early:\n{stderr.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "training did not get going"
        time.sleep(0.2)


def signal_stop(proc: subprocess.Popen, stderr: Path, sig: int) -> None:
    """Send ``sig`` to the driver so that the stop lands at the step the run is at, not some steps
    later: the consumers are held (:func:`consumers_held`) from the signal until the driver says
    it is stopping. A free consumer of the tiny run trains a step every 0.1 s, faster than the
    driver's loop notices a signal (up to 0.5 s), and could train the rest of a short run first."""
    with consumers_held(proc.pid):
        os.kill(proc.pid, sig)
        wait_for_text(proc, stderr, "[zbrl] waiting up to")


@contextlib.contextmanager
def consumers_held(root: int) -> Iterator[list[int]]:
    """SIGSTOP the run's consumer processes (``ray::ConsumerWorker``) below ``root`` for the
    block and SIGCONT them when it ends, however it ends; yields their pids."""
    pids = processes_named(root, "ray::ConsumerWorker")
    assert pids, "no consumer process in the run's tree"
    held: list[int] = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                held.append(pid)
        yield held
    finally:
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def wait_for_text(proc: subprocess.Popen, stderr: Path, text: str) -> None:
    """Until ``text`` appears in the run's stderr; AssertionError if the run ends or the wait
    passes :data:`BOUND_S` first."""
    deadline = time.monotonic() + BOUND_S
    while text not in stderr.read_text():
        assert proc.poll() is None, f"the run ended first:\n{stderr.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in the run's stderr"
        time.sleep(0.05)


def uid_log(run_dir: Path) -> list[dict]:
    """The run's ``trained_uids.jsonl``, one dict per step."""
    return [json.loads(x) for x in (run_dir / "trained_uids.jsonl").read_text().splitlines()]
