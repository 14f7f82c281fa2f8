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
from zbrl.launch.placement import Placement, reserve
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
    placement: Placement | None = None
    where: list[dict[str, Any]] = field(default_factory=list)  # summary.json "workers"

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
    placement: Placement
    group: GroupSpec | None = None
    """The consumers' data-parallel group (None for one consumer)."""

    @property
    def _data(self) -> dict[str, Any]:
        return self.cfg.model_dump(mode="json")

    def producer(self, index: int, resume_state: dict[str, Any] | None) -> Any:
        import ray

        from zbrl.launch.workers import ProducerWorker

        return (  # a restarted producer takes its predecessor's bundle
            ray.remote(ProducerWorker)
            .options(**self.placement.producer_options(index))
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

        return (
            ray.remote(ConsumerWorker)
            .options(**self.placement.consumer_options(index))
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
            .options(**self.placement.evaluator_options())
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
    place = reserve(cfg)  # placement groups first: a cluster that is too small fails here
    concurrency = 4 * (la.num_producers + la.num_consumers) + 8
    shared = {**place.shared_options(), "max_concurrency": concurrency}
    buffer = ray.remote(RolloutBuffer).options(**shared).remote(buffer_settings(cfg))
    store = ray.remote(WeightStore).options(**shared).remote()
    hub = ray.remote(TelemetryHub).options(**shared).remote()
    resume_states: dict[int, dict[str, Any] | None] = {}
    if buffer_state is not None:
        ray.get(buffer.load_state.remote(buffer_state))
        resume_states = ray.get(buffer.reclaim.remote(None))
    group_host, group = consumer_group(cfg)
    spawner = Spawner(
        cfg, artifacts, run_dir, start, total_steps, buffer, store, hub,
        ray.put(train_prompts), eval_sets, place, group,
    )  # fmt: skip
    producers = [spawner.producer(i, resume_states.get(i)) for i in range(la.num_producers)]
    consumers = [spawner.consumer(i) for i in range(la.num_consumers)]
    evaluator = spawner.evaluator()
    workers = Workers(
        buffer, store, hub, producers, consumers, evaluator, group_host=group_host, placement=place
    )
    workers.names = {a: f"producer-{i}" for i, a in enumerate(producers)}
    workers.names.update({a: f"consumer-{i}" for i, a in enumerate(consumers)})
    if evaluator is not None:
        workers.names[evaluator] = "evaluator"
    return workers, spawner
