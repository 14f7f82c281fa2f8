"""`zbrl train recipes/demo_openenv.yaml`, shortened: every producer and the evaluator start the
recipe's OpenEnv environment server (a child process on loopback), episodes go through them and
are trained with the environment's messages outside the loss, and no server outlives the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.procs import descendants, kill_tree, survivors
from helpers.runs import WARM_START_STEPS

pytest.importorskip("openenv.core", reason="OpenEnv is not installed: pip install 'zbrl[openenv]'")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SERVER_MODULE = "zbrl.environments.openenv_serve"
BOUND_S = 900.0  # start-up, a 5-step warm start and two steps on a loaded 2-core machine


def openenv_servers(root: int) -> set[int]:
    """The OpenEnv servers among ``root``'s processes."""
    found = set()
    for pid in descendants(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if SERVER_MODULE.encode() in argv:
            found.add(pid)
    return found


def test_demo_openenv_trains_and_stops_its_servers(tmp_path, run_cache):
    overrides = [
        f"logging.run_dir={tmp_path / 'run'}",
        f"logging.cache_dir={run_cache}",
        "logging.progress=false",
        "logging.log_rollout_interval=1",
        f"model.warm_start.steps={WARM_START_STEPS}",
        "data.synthetic.num_train=200",
        "data.synthetic.num_eval=16",
        "eval.max_prompts=4",
        "rollout.generation.num_generations=4",
        "rollout.inference_batch_size=2",
        "rollout.inference_microbatch_size=2",
        "training.train_batch_size=2",
        "training.train_microbatch_size=8",
        "training.max_steps=2",
    ]
    argv = [sys.executable, "-m", "zbrl.cli", "train", "recipes/demo_openenv.yaml", *overrides]
    log = tmp_path / "train.log"
    seen: set[int] = set()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + BOUND_S
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                seen |= openenv_servers(proc.pid)
                time.sleep(0.5)
        finally:
            kill_tree(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert len(seen) >= 2, "a producer's and the evaluator's server"
    assert not survivors(seen, within_s=30), "an OpenEnv server outlived the run"

    run_dir = tmp_path / "run"
    records = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    episodes = [e for r in records for e in r["turns"]]
    assert episodes and all(e[0]["role"] == "model" and e[0]["trained"] for e in episodes)
    # an episode that was not cut at the token budget ended with the environment's verdict
    # (reward and done, from the server) or at the turn limit
    assert all(e[-1]["role"] == "model" for e in episodes)
    cut = [c for r in records for c in r["truncated"]]
    for e, truncated in zip(episodes, cut, strict=True):
        ended = e[-1].get("info") or {}
        model_turns = sum(t["role"] == "model" for t in e)
        assert truncated or ended.get("done") is True or model_turns == 2
    for t in (t for e in episodes for t in e if t["role"] == "env"):
        assert not t["trained"] and t["text"] == "<|user|>Wrong, try again.<|end|><|assistant|>"
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert len(steps) == 2 and all(1.0 <= m["env/turns"] <= 2.0 for m in steps)
    assert os.path.isfile(run_dir / "eval" / "2.jsonl")
