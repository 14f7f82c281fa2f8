"""Creating a run's Ray actors: the shared ones (rollout buffer, weight store, telemetry hub) and
the workers, each of which can be created again (a producer whose process died, an evaluator
that failed) with the same arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zbrl.assembly.artifacts import Artifacts
from zbrl.assembly.settings import buffer_settings
from zbrl.config import RunConfig
from zbrl.launch.process_group import consumer_group
from zbrl.training.distributed import GroupSpec
from zbrl.types import EncodedPrompt


@dataclass(frozen=True)
class StartPoint:
    """Where the workers start: the base model (version 0), or a checkpoint being resumed."""

    model_dir: Path
    """Weights the producers, the evaluator and the consumer load."""
    version: int
    """Policy version of those weights."""
    trainer_state: str | None = None
    """The consumer state file to continue from (None: a fresh run)."""


@dataclass
class Workers:
    """Handles of every actor of a run."""

    buffer: Any
    store: Any
    hub: Any
    producers: list[Any]
    consumers: list[Any]
    evaluator: Any | None
    names: dict[Any, str] = field(default_factory=dict)
    group_host: Any = None
    """The consumers' rendezvous store (kept alive for the run), when there are several."""

    def all(self) -> list[Any]:
        out = [*self.producers, *self.consumers, self.buffer, self.store, self.hub]
        return out + ([self.evaluator] if self.evaluator is not None else [])


@dataclass
class Spawner:
    """Creates the worker actors of one run (the arguments they share are fixed here)."""

    cfg: RunConfig
    artifacts: Artifacts
    run_dir: Path
    start: StartPoint
    total_steps: int
    buffer: Any
    store: Any
    hub: Any
    prompts_ref: Any
    eval_sets: dict[str, list[EncodedPrompt]]
    group: GroupSpec | None = None
    """The consumers' data-parallel group (None for one consumer)."""

    @property
    def _data(self) -> dict[str, Any]:
        return self.cfg.model_dump(mode="json")

    def producer(self, index: int, resume_state: dict[str, Any] | None) -> Any:
        import ray

        from zbrl.launch.workers import ProducerWorker

        la = self.cfg.launch
        return (
            ray.remote(ProducerWorker)
            .options(num_cpus=la.producer_num_cpus, num_gpus=la.producer_num_gpus)
            .remote(
                self._data,
                index,
                str(self.start.model_dir),
                str(self.artifacts.tokenizer_dir),
                self.prompts_ref,
                self.buffer,
                self.store,
                self.hub,
                self.start.version,
                resume_state,
            )
        )

    def consumer(self, index: int) -> Any:
        import ray

        from zbrl.launch.workers import ConsumerWorker

        la = self.cfg.launch
        return (
            ray.remote(ConsumerWorker)
            .options(num_cpus=la.consumer_num_cpus, num_gpus=la.consumer_num_gpus)
            .remote(
                self._data,
                index,
                str(self.start.model_dir),
                str(self.artifacts.model_dir),
                str(self.artifacts.tokenizer_dir),
                str(self.run_dir),
                self.total_steps,
                self.buffer,
                self.store,
                self.hub,
                self.start.trainer_state,
                self.group,
            )
        )

    def evaluator(self) -> Any | None:
        import ray

        from zbrl.launch.workers import EvaluatorWorker

        if not self.eval_sets:
            return None
        return (
            ray.remote(EvaluatorWorker)
            .options(num_cpus=0, num_gpus=0)
            .remote(
                self._data,
                str(self.start.model_dir),
                str(self.artifacts.tokenizer_dir),
                self.eval_sets,
                str(self.run_dir),
                self.store,
                self.hub,
                self.start.version,
            )
        )


def create_workers(
    cfg: RunConfig,
    artifacts: Artifacts,
    run_dir: Path,
    train_prompts: list[EncodedPrompt],
    eval_sets: dict[str, list[EncodedPrompt]],
    total_steps: int,
    start: StartPoint,
    buffer_state: dict[str, Any] | None,
) -> tuple[Workers, Spawner]:
    """Every actor of a run; with ``buffer_state`` (a resumed run) the buffer continues from it
    and each producer from the resume point the buffer holds for it."""
    import ray

    from zbrl.telemetry.hub import TelemetryHub
    from zbrl.transport.buffer import RolloutBuffer
    from zbrl.transport.weight_sync.object_store import WeightStore

    la = cfg.launch
    concurrency = 4 * (la.num_producers + la.num_consumers) + 8
    buffer = (
        ray.remote(RolloutBuffer)
        .options(num_cpus=0, max_concurrency=concurrency, name=None)
        .remote(buffer_settings(cfg))
    )
    store = ray.remote(WeightStore).options(num_cpus=0, max_concurrency=concurrency).remote()
    hub = ray.remote(TelemetryHub).options(num_cpus=0, max_concurrency=concurrency).remote()
    resume_states: dict[int, dict[str, Any] | None] = {}
    if buffer_state is not None:
        ray.get(buffer.load_state.remote(buffer_state))
        resume_states = ray.get(buffer.reclaim.remote(None))
    group_host, group = consumer_group(cfg)
    spawner = Spawner(
        cfg, artifacts, run_dir, start, total_steps, buffer, store, hub,
        ray.put(train_prompts), eval_sets, group,
    )  # fmt: skip
    producers = [spawner.producer(i, resume_states.get(i)) for i in range(la.num_producers)]
    consumers = [spawner.consumer(i) for i in range(la.num_consumers)]
    evaluator = spawner.evaluator()
    workers = Workers(buffer, store, hub, producers, consumers, evaluator, group_host=group_host)
    workers.names = {a: f"producer-{i}" for i, a in enumerate(producers)}
    workers.names.update({a: f"consumer-{i}" for i, a in enumerate(consumers)})
    if evaluator is not None:
        workers.names[evaluator] = "evaluator"
    return workers, spawner
