"""Reward workers: actors that hold a reward model (``reward.type: reward_model`` with
``reward.workers`` > 0) and score the producers' batches.

Each worker loads the model once, on a GPU in the inference dtype (``rollout.inference_dtype``)
when ``reward.worker_num_gpus`` > 0, else on CPU in float32. The workers' resources
(``reward.worker_num_cpus`` / ``worker_num_gpus``) are reserved with the producers' and
consumers' (:func:`zbrl.launch.placement.reserve`, a SPREAD group of their own) and counted when a
local Ray is sized (:func:`zbrl.launch.ray_setup.required_cpus`): a worker the cluster cannot
place is an error at start, never batches that time out. A producer sends every batch, whole,
to the next worker in turn (:class:`RayRewardScorer`); the reward's own deadline
(``reward.timeout_s``) bounds the wait, and a batch whose worker is dead or late has no score:
its responses are failed results, their groups are dropped and counted (``reward_failed``),
never trained.

A worker whose process dies is restarted by Ray (``max_restarts``: its handle stays valid, the
producers keep sending to it), up to ``reward.worker_max_restarts`` times; the driver's supervisor
polls :class:`RewardWorkerWatch`, which counts the restarts (``reward_worker_restarts`` in the
metrics and ``summary.json``) and names a worker that died past its budget, which ends the run.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

from zbrl.config import RewardModelReward, RunConfig
from zbrl.launch.placement import Placement


class RewardModelWorker:
    """A reward model in its own process, scoring (prompt messages, response) pairs."""

    def __init__(self, cfg_data: dict[str, Any], index: int) -> None:
        import torch

        from zbrl.assembly.models import inference_dtype
        from zbrl.assembly.rewards import reward_model_scorer
        from zbrl.models.quiet import quiet_transformers

        cfg = RunConfig.model_validate(cfg_data)
        quiet_transformers()
        torch.set_num_threads(cfg.launch.torch_threads)
        rw = cfg.reward
        assert isinstance(rw, RewardModelReward)
        self.index = index
        on_gpu = rw.worker_num_gpus > 0
        self.scorer = reward_model_scorer(
            cfg,
            device="cuda" if on_gpu else "cpu",
            dtype=inference_dtype(cfg) if on_gpu else torch.float32,
        )

    def score(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[float]:
        return self.scorer.score(prompts, responses)

    def placement(self) -> dict[str, Any]:
        """Where this worker runs (node id, address, host, pid)."""
        from zbrl.launch.placement import describe_process

        return describe_process()


class RayRewardScorer:
    """The producers' client of the reward workers: each batch goes to the next worker in turn;
    the wait is bounded by ``timeout_s`` (the reward's deadline enforces it as well)."""

    def __init__(self, handles: Sequence[Any], timeout_s: float) -> None:
        if not handles:
            raise ValueError("RayRewardScorer needs at least one reward worker")
        self.handles = list(handles)
        self.timeout_s = timeout_s
        self._turn = itertools.cycle(range(len(self.handles)))
        self._lock = threading.Lock()

    def score(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[float]:
        import ray

        with self._lock:
            handle = self.handles[next(self._turn)]
        return ray.get(handle.score.remote(list(prompts), list(responses)), timeout=self.timeout_s)


def uses_reward_workers(cfg: RunConfig) -> bool:
    return isinstance(cfg.reward, RewardModelReward) and cfg.reward.workers > 0


def spawn_reward_workers(cfg: RunConfig, placement: Placement | None) -> list[Any]:
    """The run's reward workers (none unless ``reward.workers`` > 0), in ``placement``'s
    reward-worker bundles (None: where Ray puts them, for a test without a placement)."""
    if not uses_reward_workers(cfg):
        return []
    import ray

    rw = cfg.reward
    assert isinstance(rw, RewardModelReward)
    data = cfg.model_dump(mode="json")
    restarts = {
        "max_restarts": rw.worker_max_restarts,
        "max_task_retries": 0,  # a batch in flight when it died has no score (a failure)
    }
    workers = []
    for i in range(rw.workers):
        where = (
            placement.reward_worker_options(i)
            if placement is not None
            else {"num_cpus": rw.worker_num_cpus, "num_gpus": rw.worker_num_gpus}
        )
        workers.append(ray.remote(RewardModelWorker).options(**where, **restarts).remote(data, i))
    return workers


def reward_scorer(cfg: RunConfig, handles: Sequence[Any] | None) -> RayRewardScorer | None:
    """The scorer a producer's reward sends its batches through (None: score in-process)."""
    if not handles:
        return None
    return RayRewardScorer(handles, timeout_s=cfg.reward.timeout_s)  # type: ignore[union-attr]


class RewardWorkerWatch:
    """Reads the reward workers' states from Ray's actor table: restarts since the last poll,
    and the first worker that is dead for good (past ``reward.worker_max_restarts``)."""

    def __init__(self, handles: Sequence[Any], max_restarts: int, interval_s: float = 2.0) -> None:
        self.handles = list(handles)
        self.max_restarts = max_restarts
        self.interval_s = interval_s
        self.restarts = 0
        """Restarts of all the workers seen so far."""
        self._seen = [0] * len(self.handles)
        self._next = 0.0

    def track(self, handles: Sequence[Any]) -> None:
        """Watch ``handles`` instead (the run's workers were re-created); the count goes on."""
        self.handles = list(handles)
        self._seen = [0] * len(self.handles)

    def poll(self, now: float) -> tuple[list[str], str | None]:
        """(a line for each restart seen since the last poll, the error of a worker that is
        dead for good or None); reads the actor table at most every ``interval_s``."""
        if not self.handles or now < self._next:
            return [], None
        self._next = now + self.interval_s
        lines: list[str] = []
        for index, handle in enumerate(self.handles):
            state, restarts = actor_state(handle)
            name = f"reward-worker-{index}"
            for n in range(self._seen[index] + 1, restarts + 1):
                lines.append(
                    f"{name}'s process died; Ray restarts it ({n} of {self.max_restarts} "
                    "restarts, reward.worker_max_restarts)"
                )
            self.restarts += max(0, restarts - self._seen[index])
            self._seen[index] = max(self._seen[index], restarts)
            if state == "DEAD":
                return lines, (
                    f"{name} died and was not restarted ({restarts} of {self.max_restarts} "
                    "restarts used, reward.worker_max_restarts): the producers cannot score. "
                    "See its log under the Ray session's logs; raise reward.worker_max_restarts "
                    "or score in the producers (reward.workers=0)"
                )
        return lines, None


def actor_state(handle: Any) -> tuple[str, int]:
    """An actor's state (``ALIVE``, ``RESTARTING``, ``DEAD``, ...) and its restart count, from
    the cluster's actor table."""
    from ray._private import state

    row = state.actors(handle._actor_id.hex())
    return str(row.get("State", "")), int(row.get("NumRestarts", 0))
