"""An idle consumer's own generation (``rollout.consumers_generate``, docs/planning.md).

When the buffer cannot fill a consumer's next step, the consumer generates groups itself with its
own weights, which are always the newest, so its groups carry its current version (staleness 0
when made). It does so through the one rollout path: a :class:`~zbrl.rollout.producer.Producer`
of its own (same episodes, scoring and records: per-token versions, behaviour log-probs) on a
transformers backend over the consumer's own policy module, whose "weights receiver" is the
consumer's version (:class:`CurrentWeights`: nothing to receive or load). That producer takes
tickets under the same admission rule as every producer, one small batch at a time and without
waiting for admission (:meth:`~zbrl.rollout.producer.Producer.try_step`), so the consumer can
take its next step as soon as it is ready.

Its prompts: a stream of its own over the whole training set (its own shuffle seed; group uids
``<prompt uid>@c<rank>e<epoch>``), so the producers' shards are untouched; it never ends (the
run ends when the producers' data or ``max_steps`` does). Its position is part of the
consumer's checkpoint (:meth:`ConsumerGeneration.state`), not of the buffer's producer states.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from zbrl.rollout.idle_planner import OnlinePlanner
from zbrl.rollout.producer import Producer
from zbrl.types import RolloutGroup

STREAM_SEED = 1_000_003
"""Added (times the consumer's rank + 1) to ``data.seed`` for a consumer's prompt stream."""


class CurrentWeights:
    """The weight receiver of a consumer's producer: the weights are the consumer's own, so the
    loaded version is the consumer's and there is never anything to fetch or load."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.latencies_s: list[float] = []

    @property
    def loaded_version(self) -> int:
        return self.version

    def poll(self) -> int:
        return -1

    def wait_for(self, version: int, timeout: float | None = None) -> bool:
        """The consumer's version is the newest there is: any reservation's minimum is at most
        it (``min_version <= version`` by the admission rule)."""
        if version > self.version:
            raise RuntimeError(
                f"a consumer generating at version {self.version} was asked for weights of "
                f"version {version}, which do not exist yet (admission rule broken)"
            )
        return True

    def receive_into(self, load: Callable[[dict[str, torch.Tensor]], Any]) -> bool:
        return False

    def close(self) -> None:
        pass


class ConsumerGeneration:
    """What a consumer calls while it waits (:class:`zbrl.training.consumer.IdleGeneration`)."""

    def __init__(
        self,
        producer: Producer,
        weights: CurrentWeights,
        planner: OnlinePlanner,
        module: torch.nn.Module,
        *,
        prompts_per_batch: int,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        """``producer``: generates on a backend over ``module`` (the consumer's policy) and
        reports to ``weights``'s version; ``prompts_per_batch``: prompts per generation batch;
        ``autocast_dtype``: the inference dtype when it is not the module's own (float32 master
        weights): generation runs under autocast to it, without a copy of the weights."""
        self.producer = producer
        self.weights = weights
        self.planner = planner
        self.module = module
        self.prompts_per_batch = prompts_per_batch
        self.autocast_dtype = autocast_dtype
        self.ended = False
        """The buffer closed or stopped (no more admission): generation is over for the run."""
        self.groups_made = 0
        self._made_this_step = 0
        self._generated_this_step = False

    @property
    def producer_index(self) -> int:
        """The producer id its groups carry (``RolloutGroup.producer``)."""
        return self.producer.settings.index

    def wants(self) -> bool:
        """Whether to generate while waiting for the next step."""
        return not self.ended and self.planner.generate()

    def generate(self, version: int) -> bool:
        """One generation batch with the weights of ``version`` if admission has room; True when
        it made groups (False: no room, or the run's admission ended)."""
        self.weights.version = version
        self._generated_this_step = True
        was_training = self.module.training
        self.module.eval()  # the engine puts it back in training mode at its next step
        started = time.perf_counter()
        try:
            with self._autocast():
                made = self.producer.try_step(self.prompts_per_batch)
        finally:
            self.module.train(was_training)
        if made is None:
            self.ended = True
            return False
        if made:
            self.planner.add_generation(made, time.perf_counter() - started)
            self.groups_made += made
            self._made_this_step += made
        return made > 0

    def step_done(
        self, train_s: float, step_s: float, groups: list[RolloutGroup]
    ) -> dict[str, float]:
        """A step trained ``groups`` in ``train_s`` of its ``step_s`` seconds: feed the planner;
        the step's ``consumer_*`` and ``planned_*`` metrics (``consumer_trained_groups``: the
        groups consumers made, by any rank)."""
        generated = self._generated_this_step
        producers = self.producer.settings.num_producers  # consumers' ids come after theirs
        producer_groups = sum(g.producer < producers for g in groups)
        self.planner.add_step(train_s, step_s, producer_groups, generated)
        out = {
            "consumer_generated_groups": float(self._made_this_step),
            "consumer_trained_groups": float(len(groups) - producer_groups),
            "consumer_generating": float(generated),
            **self.planner.metrics(),
        }
        self._made_this_step, self._generated_this_step = 0, False
        return out

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        device = next(self.module.parameters()).device.type
        return torch.autocast(device, dtype=self.autocast_dtype)

    def state(self) -> dict[str, Any]:
        """Its prompt stream's position and counters (:meth:`Producer.state`)."""
        return {"producer": self.producer.state(), "groups_made": self.groups_made}

    def load_state(self, state: dict[str, Any]) -> None:
        self.producer.load_state(state["producer"])
        self.groups_made = state["groups_made"]
