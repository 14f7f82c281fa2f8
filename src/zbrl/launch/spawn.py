"""Creating a run's Ray actors: the shared ones (rollout buffer, weight store, telemetry hub) and
the workers, each of which can be created again (a producer whose process died, an evaluator
that failed) with the same arguments; and every actor but the telemetry hub again from a
checkpoint (a consumer whose process died: :meth:`Spawner.respawn`), in the same placement."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zbrl.config import RunConfig
from zbrl.launch.placement import Placement, reserve
from zbrl.launch.shipping import Shipper
from zbrl.launch.worker_specs import ConsumerSpec, EvaluatorSpec, ProducerSpec
from zbrl.training.checkpoint import Checkpoint

if TYPE_CHECKING:  # the driver finds its start point without torch (docs/performance.md)
    from zbrl.assembly.artifacts import Artifacts
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
    reward_workers: list[Any] = field(default_factory=list)
    """Reward-model actors the producers score with (``reward.workers``)."""
    head_files: Any = None
    """The actor writing the head's run directory for workers on other nodes (None: one node)."""
    where: list[dict[str, Any]] = field(default_factory=list)  # summary.json "workers"

    def all(self) -> list[Any]:
        out = [*self.producers, *self.consumers, self.buffer, self.store, self.hub]
        out += self.reward_workers + ([self.head_files] if self.head_files is not None else [])
        return out + ([self.evaluator] if self.evaluator is not None else [])

    def replace_with(self, new: Workers) -> None:
        """Take every handle of ``new`` (a run whose workers were re-created), in place: whoever
        holds this object (the driver's shutdown) ends the new actors."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(new, f.name))


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
    reward_workers: list[Any] = field(default_factory=list)
    """The reward workers the producers send their batches to (none: they score in-process)."""
    shipper: Shipper | None = None
    """Ships the model, tokenizer and checkpoint directories to the workers' nodes (None: the
    workers read the driver's paths; :mod:`zbrl.launch.shipping`)."""
    head_files: Any = None
    """The :class:`~zbrl.launch.head_files.HeadFiles` actor that workers on other nodes copy
    their checkpoints and eval files to (None on a single node)."""

    def _ship(self, directory: Path) -> Any:
        shipper = self.shipper or Shipper(self.placement.driver_node, multi_node=False)
        return shipper.ship(directory)

    @property
    def _run_dir(self) -> str:
        """The run directory as the driver sees it (absolute: a worker's cwd is its node's)."""
        return str(Path(self.run_dir).absolute())

    @property
    def _trainer_state(self) -> str | None:
        """The start's consumer state file, absolute as the driver sees it (None: fresh)."""
        state = self.start.trainer_state
        return None if state is None else str(Path(state).absolute())

    def respawn(
        self,
        start: StartPoint,
        buffer_state: dict[str, Any] | None,
        fresh: tuple[Any, Any] | None = None,
    ) -> tuple[Workers, Spawner]:
        """Every actor but the telemetry hub, new, starting from ``start``: a fresh rollout buffer
        (continuing from ``buffer_state`` when given, each producer from the resume point it
        holds for it), weight store and consumers' group, the producers, consumers and
        evaluator, in this spawner's placement; and the spawner that creates their
        replacements. ``fresh``: a new rollout buffer and weight store created already (by
        :func:`start_shared_actors`), used instead of creating them here."""
        import ray

        cfg, la = self.cfg, self.cfg.launch
        buffer, store = fresh if fresh is not None else _buffer_and_store(cfg, self.placement)
        resume_states: dict[int, dict[str, Any] | None] = {}
        if buffer_state is not None:
            ray.get(buffer.load_state.remote(buffer_state))
            resume_states = ray.get(buffer.reclaim.remote(None))
        from zbrl.launch.process_group import consumer_group

        group_host, group = consumer_group(cfg)
        from zbrl.launch.reward_workers import spawn_reward_workers

        spawner = dataclasses.replace(
            self, start=start, buffer=buffer, store=store, group=group,
            reward_workers=spawn_reward_workers(cfg, self.placement),
        )  # fmt: skip
        producers = [spawner.producer(i, resume_states.get(i)) for i in range(la.num_producers)]
        consumers = [spawner.consumer(i) for i in range(la.num_consumers)]
        evaluator = spawner.evaluator()
        workers = Workers(
            buffer, store, self.hub, producers, consumers, evaluator,
            group_host=group_host, placement=self.placement,
            reward_workers=spawner.reward_workers, head_files=self.head_files,
        )  # fmt: skip
        workers.names = {a: f"producer-{i}" for i, a in enumerate(producers)}
        workers.names.update({a: f"consumer-{i}" for i, a in enumerate(consumers)})
        if evaluator is not None:
            workers.names[evaluator] = "evaluator"
        return workers, spawner

    @property
    def _data(self) -> dict[str, Any]:
        return self.cfg.model_dump(mode="json")

    @property
    def _tokenizer(self) -> Any:
        return self._ship(self.artifacts.tokenizer_dir)

    def producer(self, index: int, resume_state: dict[str, Any] | None) -> Any:
        import ray

        from zbrl.launch.workers import ProducerWorker

        spec = ProducerSpec(
            cfg_data=self._data, index=index, model=self._ship(self.start.model_dir),
            tokenizer=self._tokenizer, buffer=self.buffer, store=self.store, hub=self.hub,
            initial_version=self.start.version, resume_state=resume_state,
            reward_workers=self.reward_workers,
        )  # fmt: skip
        return (  # a restarted producer takes its predecessor's bundle
            ray.remote(ProducerWorker)
            .options(**self.placement.producer_options(index))
            .remote(spec, self.prompts_ref)  # the prompts' value: a top-level argument
        )

    def consumer(self, index: int) -> Any:
        import ray

        from zbrl.launch.workers import ConsumerWorker

        spec = ConsumerSpec(
            cfg_data=self._data, index=index, model=self._ship(self.start.model_dir),
            reference=self._ship(self.artifacts.model_dir), tokenizer=self._tokenizer,
            run_dir=self._run_dir, total_steps=self.total_steps, buffer=self.buffer,
            store=self.store, hub=self.hub, trainer_state=self._trainer_state, group=self.group,
            head_files=self.head_files,
        )  # fmt: skip
        return (
            ray.remote(ConsumerWorker)
            .options(**self.placement.consumer_options(index))
            .remote(spec, self.prompts_ref)
        )

    def evaluator(self) -> Any | None:
        import ray

        from zbrl.launch.workers import EvaluatorWorker

        if not self.eval_sets:
            return None
        spec = EvaluatorSpec(
            cfg_data=self._data, model=self._ship(self.start.model_dir), tokenizer=self._tokenizer,
            eval_sets=self.eval_sets, run_dir=self._run_dir, store=self.store, hub=self.hub,
            initial_version=self.start.version, head_files=self.head_files,
        )  # fmt: skip
        return (
            ray.remote(EvaluatorWorker).options(**self.placement.evaluator_options()).remote(spec)
        )


@dataclass
class SharedActors:
    """The placement and the actors a run creates before its inputs are ready
    (:func:`start_shared_actors`)."""

    placement: Placement
    hub: Any
    buffer: Any
    store: Any

    def end(self) -> None:
        """Kill them and free the placement (a start that failed before the workers existed)."""
        import ray

        for actor in (self.hub, self.buffer, self.store):
            with contextlib.suppress(Exception):  # already dead
                ray.kill(actor, no_restart=True)
        self.placement.remove()


def start_shared_actors(cfg: RunConfig) -> SharedActors:
    """The placement groups (a cluster that is too small fails here) and the actors that need
    nothing but the config: telemetry hub, rollout buffer, weight store. The driver asks for them
    as soon as Ray is up, while it prepares the inputs, so that their processes start before the
    workers' (Ray starts only so many worker processes at once; docs/performance.md,
    Start-up)."""
    import ray

    from zbrl.telemetry.hub import TelemetryHub

    place = reserve(cfg)
    hub = ray.remote(TelemetryHub).options(**_shared_options(cfg, place)).remote()
    buffer, store = _buffer_and_store(cfg, place)
    return SharedActors(place, hub, buffer, store)


def create_workers(
    cfg: RunConfig,
    artifacts: Artifacts,
    run_dir: Path,
    train_prompts: list[EncodedPrompt],
    eval_sets: dict[str, list[EncodedPrompt]],
    total_steps: int,
    start: StartPoint,
    buffer_state: dict[str, Any] | None,
    shared: SharedActors | None = None,
) -> tuple[Workers, Spawner]:
    """Every actor of a run (with ``shared``, the ones :func:`start_shared_actors` created
    already); with ``buffer_state`` (a resumed run) the buffer continues from it and each
    producer from the resume point the buffer holds for it."""
    import ray

    shared = shared or start_shared_actors(cfg)
    shipper, head_files = files_across_nodes(shared.placement, run_dir)
    base = Spawner(
        cfg, artifacts, run_dir, start, total_steps, None, None, shared.hub,
        ray.put(train_prompts), eval_sets, shared.placement,
        shipper=shipper, head_files=head_files,
    )  # fmt: skip
    return base.respawn(start, buffer_state, fresh=(shared.buffer, shared.store))


def files_across_nodes(placement: Placement, run_dir: Path) -> tuple[Shipper, Any]:
    """The shipper of the workers' input directories and, on a cluster of more than one node
    (counted at the start), the actor on the driver's node that workers elsewhere copy their
    checkpoints and eval files to (None on a single node)."""
    import ray

    from zbrl.launch.head_files import HeadFiles

    multi_node = sum(1 for node in ray.nodes() if node["Alive"]) > 1
    shipper = Shipper(placement.driver_node, multi_node=multi_node)
    if not multi_node:
        return shipper, None
    head = ray.remote(HeadFiles).options(**placement.shared_options())
    return shipper, head.remote(str(Path(run_dir).absolute()))


def _buffer_and_store(cfg: RunConfig, place: Placement) -> tuple[Any, Any]:
    import ray

    from zbrl.assembly.shared_settings import buffer_settings
    from zbrl.transport.buffer import RolloutBuffer
    from zbrl.transport.weight_sync.store import WeightStore

    options = _shared_options(cfg, place)
    buffer = ray.remote(RolloutBuffer).options(**options).remote(buffer_settings(cfg))
    return buffer, ray.remote(WeightStore).options(**options).remote()


def _shared_options(cfg: RunConfig, place: Placement) -> dict[str, Any]:
    la = cfg.launch
    concurrency = 4 * (la.num_producers + la.num_consumers) + 8
    return {**place.shared_options(), "max_concurrency": concurrency}


def checkpoint_start(
    artifacts: Artifacts, checkpoint: Checkpoint | None
) -> tuple[StartPoint, dict[str, Any] | None]:
    """Where the workers start from ``checkpoint`` (None: the base model at version 0), and the
    buffer state to restore with it."""
    from zbrl.training.checkpoint import load_state

    if checkpoint is None:
        return StartPoint(model_dir=artifacts.model_dir, version=0), None
    start = StartPoint(checkpoint.path, checkpoint.version, str(checkpoint.trainer_file))
    return start, load_state(checkpoint.buffer_file)
