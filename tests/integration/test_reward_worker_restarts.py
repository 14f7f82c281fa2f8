"""A reward worker killed by its PID: Ray restarts it (the producers' handle keeps working), the
watch counts the restart, and past ``reward.worker_max_restarts`` it names the dead worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from zbrl.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"
BOUND_S = 120.0
PROMPT = [{"role": "user", "content": "What is 1+2?"}]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    from zbrl.embedded.reward_model import build_tiny_reward_model, save_reward_model
    from zbrl.embedded.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_tiny_reward_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    return save_reward_model(model, tokenizer, tmp_path_factory.mktemp("rm") / "rm")


def _poll_until(watch, want_dead: bool):
    """Every restart line the watch reports until it reports a restart (or the dead worker)."""
    deadline, seen = time.monotonic() + BOUND_S, []
    while time.monotonic() < deadline:
        lines, dead = watch.poll(time.monotonic())
        seen += lines
        if (dead is not None) if want_dead else bool(lines):
            return seen, dead
        time.sleep(0.2)
    raise AssertionError(f"the watch saw nothing within {BOUND_S}s (lines so far: {seen})")


def _wait_alive(worker) -> None:
    from zbrl.launch.reward_workers import actor_state

    deadline = time.monotonic() + BOUND_S
    while actor_state(worker)[0] != "ALIVE":
        assert time.monotonic() < deadline, f"not alive again within {BOUND_S}s"
        time.sleep(0.2)


def test_a_killed_reward_worker_restarts_is_counted_then_named_past_its_budget(rm_dir):
    import ray

    from zbrl.launch.reward_workers import (
        RayRewardScorer,
        RewardWorkerWatch,
        actor_state,
        spawn_reward_workers,
    )

    cfg = load_config(
        DEMO,
        [
            "reward.type=reward_model",
            f"reward.path={rm_dir}",
            "reward.workers=1",
            "reward.worker_num_cpus=0",
            "reward.worker_max_restarts=1",
        ],
    )
    [worker] = spawn_reward_workers(cfg, None)
    try:
        scorer = RayRewardScorer([worker], timeout_s=BOUND_S)
        watch = RewardWorkerWatch([worker], max_restarts=1, interval_s=0.0)
        first = ray.get(worker.placement.remote(), timeout=BOUND_S)["pid"]
        [before] = scorer.score([PROMPT], ["<answer>3</answer>"])

        os.kill(first, signal.SIGKILL)
        lines, dead = _poll_until(watch, want_dead=False)
        assert dead is None and watch.restarts == 1
        assert lines == [
            "reward-worker-0's process died; Ray restarts it (1 of 1 restarts, "
            "reward.worker_max_restarts)"
        ]
        # the same handle scores again, in a new process, with the same model
        _wait_alive(worker)
        second = ray.get(worker.placement.remote(), timeout=BOUND_S)["pid"]
        assert second != first
        [after] = scorer.score([PROMPT], ["<answer>3</answer>"])
        assert after == pytest.approx(before, abs=1e-6)

        os.kill(second, signal.SIGKILL)  # past the budget: dead for good
        _, dead = _poll_until(watch, want_dead=True)
        assert dead is not None and dead.startswith("reward-worker-0 died and was not restarted")
        assert "1 of 1 restarts used" in dead and "reward.worker_max_restarts" in dead
        assert actor_state(worker) == ("DEAD", 1)
        with pytest.raises(ray.exceptions.RayActorError):
            scorer.score([PROMPT], ["<answer>3</answer>"])
    finally:
        ray.kill(worker, no_restart=True)
