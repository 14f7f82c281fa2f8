"""What runs inside the workers' Ray actor processes: each role builds its heavy state (models,
backends) in its own process and wraps one plain role (Producer, Consumer, Evaluator). The actor
classes the driver creates are the light shells of :mod:`zbrl.launch.workers`, which import this
module (torch, transformers) in the worker's process only."""

# ruff: noqa: E402  (the imports follow the clock that times them)
from __future__ import annotations

import time

_MODULE_STARTED = time.time()
"""When this module began importing: in a worker's process, the start of its ``startup`` span."""
_MODULE_CPU = time.process_time()
_MODULE_PID = __import__("os").getpid()
"""The process that imported this module: another one when a worker was forked with it
imported (:mod:`zbrl.launch.local_ray.forkserver`)."""

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from zbrl.assembly.environments import build_episode_runner
from zbrl.assembly.models import (
    build_backend,
    build_trainer,
    inference_dtype,
    load_tokenizer,
)
from zbrl.assembly.rewards import build_eval_reward_fn, build_reward_fn
from zbrl.assembly.settings import (
    broadcast_settings,
    consumer_settings,
    eval_sampling_params,
    producer_settings,
)
from zbrl.config import RunConfig
from zbrl.config.transport import ObjectStoreSync
from zbrl.launch.head_files import HeadMirror, node_run_dir
from zbrl.launch.placement import describe_process, node_address
from zbrl.launch.reward_workers import reward_scorer
from zbrl.launch.shipping import ShippedDir, local_dir, local_path, on_driver_node
from zbrl.launch.startup import process_start_time
from zbrl.launch.worker_specs import ConsumerSpec, EvaluatorSpec, ProducerSpec
from zbrl.models.quiet import quiet_transformers
from zbrl.rewards.base import prepare_reward
from zbrl.telemetry.spans import STARTUP, SpanRecorder
from zbrl.training.consumer import ThreadLending
from zbrl.training.distributed import join_group
from zbrl.transport.clients import BufferClient, HubClient, WeightStoreClient
from zbrl.transport.handles import RayHandle
from zbrl.transport.weight_sync.factory import build_publisher, build_receiver
from zbrl.types import EncodedPrompt

_IMPORTS_S = time.time() - _MODULE_STARTED


class StartupTimer:
    """A worker's ``startup`` span: from its module's import (the first worker built in this
    process) or from its constructor's start, to the end of its construction; the span carries
    ``imports_s``, the seconds of each timed :meth:`part` (``<name>_s``) and ``cpu_s``, the CPU
    seconds of the whole process over the span. A worker forked by the fork server, with this
    module imported there, starts its span at its creation, with ``imports_s`` 0."""

    _first = True

    def __init__(self) -> None:
        self.began = time.time()
        self.cpu_began = time.process_time()
        self.parts: dict[str, float] = {}
        if StartupTimer._first:
            StartupTimer._first = False
            if os.getpid() == _MODULE_PID:
                self.began, self.parts["imports_s"] = _MODULE_STARTED, _IMPORTS_S
                self.cpu_began = _MODULE_CPU
            else:  # forked from the fork server, this module imported: from the fork on
                self.began = process_start_time() or self.began
                self.parts["imports_s"], self.cpu_began = 0.0, 0.0

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        t = time.time()
        try:
            yield
        finally:
            self.parts[f"{name}_s"] = time.time() - t

    def record(self, recorder: SpanRecorder) -> None:
        cpu_s = time.process_time() - self.cpu_began
        recorder.record(STARTUP, self.began, time.time(), cpu_s=cpu_s, **self.parts)


class SpanFlusher:
    """Sends a recorder's spans to the telemetry hub every ``interval_s`` from a daemon thread."""

    def __init__(self, recorder: SpanRecorder, hub: HubClient, interval_s: float = 1.0) -> None:
        self.recorder = recorder
        self.hub = hub
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="span-flusher", daemon=True)
        self._thread.start()

    def flush(self) -> None:
        spans = self.recorder.drain()
        if spans:
            self.hub.add_spans(spans)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:  # the hub is gone: the run is ending
                return


def _run_role(run: Any, close: Any, recorder: SpanRecorder, hub: HubClient) -> Any:
    """Run a role's loop with its spans streamed to the hub; always close and flush."""
    flusher = SpanFlusher(recorder, hub)
    try:
        return run()
    finally:
        close()
        flusher.stop()


def _lending(cfg: RunConfig) -> ThreadLending | None:
    """A lone consumer borrows parked producers' threads (``launch.lend_threads``)."""
    if not cfg.launch.lend_threads or cfg.launch.num_consumers > 1:
        return None
    t = cfg.launch.torch_threads
    return ThreadLending(own=t, per_producer=t, cap=max(t, len(os.sched_getaffinity(0))))


EVAL_DIR = "eval"
"""The evaluator's per-sample files in the run directory: ``eval/STEP.jsonl``."""


def local_dirs(cfg: RunConfig, model: ShippedDir, tokenizer: ShippedDir) -> tuple[Path, Path]:
    """The model and tokenizer directories where this worker's node has them."""
    cache = cfg.logging.cache_dir
    return local_dir(model, cache), local_dir(tokenizer, cache)


def head_mirror(head_files: Any, driver_node: str, local_run_dir: Path) -> HeadMirror | None:
    """What copies a worker's run files to the head: None on the driver's node (or one node)."""
    if head_files is None or on_driver_node(driver_node):
        return None
    return HeadMirror(head_files, local_run_dir)


def _setup_process(cfg: RunConfig, seed_offset: int) -> None:
    quiet_transformers()
    torch.set_num_threads(cfg.launch.torch_threads)
    torch.manual_seed(cfg.seed + seed_offset)


class ProducerRole:
    """A Producer in its own process."""

    def __init__(self, spec: ProducerSpec, prompts: list[EncodedPrompt]) -> None:
        """``spec``: :class:`zbrl.launch.worker_specs.ProducerSpec`; ``prompts``: its shard."""
        from zbrl.rollout.producer import Producer

        timer = StartupTimer()
        cfg = RunConfig.model_validate(spec.cfg_data)
        _setup_process(cfg, 1000 + spec.index)
        self.recorder = SpanRecorder(f"producer-{spec.index}", "producer")
        self.hub = HubClient(RayHandle(spec.hub))
        with timer.part("reward"):  # first: what it starts in the background (prepare) has
            # the model's load to finish in
            reward_fn = build_reward_fn(cfg, scorer=reward_scorer(cfg, spec.reward_workers))
            prepare_reward(reward_fn)
        with timer.part("files"):
            model_dir, tokenizer_dir = local_dirs(cfg, spec.model, spec.tokenizer)
        with timer.part("backend"):
            backend = build_backend(cfg, model_dir, tokenizer_dir)
        self.receiver = build_receiver(
            cfg.transport.weight_sync,
            WeightStoreClient(RayHandle(spec.store)),
            self.recorder,
            initial_version=spec.initial_version,
            member=f"producer-{spec.index}",
            broadcast=broadcast_settings(cfg, node_address()),
        )
        settings = producer_settings(cfg, spec.index)
        self.producer = Producer(
            settings,
            prompts,
            backend,
            reward_fn,
            BufferClient(RayHandle(spec.buffer), node=describe_process()["node_id"]),
            self.receiver,
            self.recorder,
            build_episode_runner(cfg, backend, settings.sampling.max_new_tokens),
        )
        if spec.resume_state is not None:
            self.producer.load_state(spec.resume_state)
        timer.record(self.recorder)

    def placement(self) -> dict[str, Any]:
        """Where this worker runs (node id, address, host, pid)."""
        return describe_process()

    def run(self):
        return _run_role(self.producer.run, self.receiver.close, self.recorder, self.hub)


class ConsumerRole:
    """A Consumer (policy, optional frozen reference, optimizer) in its own process; with
    ``spec.group``, rank ``spec.index`` of the consumers' data-parallel process group."""

    def __init__(self, spec: ConsumerSpec, prompts: list[EncodedPrompt] | None = None) -> None:
        """``spec``: :class:`zbrl.launch.worker_specs.ConsumerSpec`; ``prompts``: the training
        prompts, for its own generation while it waits (``rollout.consumers_generate``; None:
        it never generates)."""
        from zbrl.training.checkpoint import load_state
        from zbrl.training.consumer import Consumer

        timer = StartupTimer()
        cfg = RunConfig.model_validate(spec.cfg_data)
        _setup_process(cfg, spec.index)
        if spec.group is not None:  # a rank: in the group before the engine is built
            with timer.part("group"):
                join_group(spec.group, rank=spec.index)
        self.recorder = SpanRecorder(f"consumer-{spec.index}", "consumer")
        self.hub = HubClient(RayHandle(spec.hub))
        with timer.part("files"):
            model_dir, tokenizer_dir = local_dirs(cfg, spec.model, spec.tokenizer)
            reference_dir = local_dir(spec.reference, cfg.logging.cache_dir)
            local_run_dir = node_run_dir(
                spec.run_dir, spec.model.driver_node, cfg.logging.cache_dir
            )
        with timer.part("tokenizer"):
            tokenizer = load_tokenizer(cfg, tokenizer_dir)
        with timer.part("trainer"):
            trainer = build_trainer(
                cfg, model_dir, tokenizer, spec.total_steps, reference_dir=reference_dir
            )
        # only rank 0 publishes; the other ranks hold a publisher that is never called, and must
        # not join (or form) the broadcast group
        sync = cfg.transport.weight_sync if spec.index == 0 else ObjectStoreSync()
        self.publisher = build_publisher(
            sync,
            WeightStoreClient(RayHandle(spec.store)),
            self.recorder,
            broadcast=broadcast_settings(cfg, node_address()),
            dtype=inference_dtype(cfg),  # the producers' and evaluator's inference dtype
        )
        self.consumer = Consumer(
            consumer_settings(cfg, local_run_dir),
            trainer,
            BufferClient(RayHandle(spec.buffer), node=describe_process()["node_id"]),
            self.publisher,
            self.recorder,
            tokenizer=tokenizer,
            on_step=self.hub.add_metrics,
            on_rollouts=lambda step, recs: self.hub.add_event("rollouts", recs),
            lending=_lending(cfg),
            mirror=head_mirror(spec.head_files, spec.model.driver_node, local_run_dir),
            generation=_consumer_generation(
                cfg, spec.index, trainer, tokenizer, prompts, spec.buffer, self.recorder, timer
            ),
        )
        if spec.trainer_state is not None:
            with timer.part("trainer_state"):
                state_file = local_path(spec.model, model_dir, spec.trainer_state)
                self.consumer.load_state(load_state(state_file))
        timer.record(self.recorder)

    def placement(self) -> dict[str, Any]:
        """Where this worker runs (node id, address, host, pid)."""
        return describe_process()

    def run(self):
        return _run_role(self.consumer.run, self.publisher.close, self.recorder, self.hub)


def _consumer_generation(
    cfg: RunConfig,
    rank: int,
    trainer: Any,
    tokenizer: Any,
    prompts: list[EncodedPrompt] | None,
    buffer: Any,
    recorder: SpanRecorder,
    timer: StartupTimer,
) -> Any:
    """The consumer's own generation (:mod:`zbrl.assembly.consumer_generation`), or None: its
    reward scores in this process, and its buffer client has no node (never a parked
    producer)."""
    from zbrl.assembly.consumer_generation import (
        build_consumer_generation,
        consumer_generation_mode,
    )

    if prompts is None or consumer_generation_mode(cfg) == "off":
        return None
    with timer.part("generation"):
        reward_fn = build_reward_fn(cfg)
        prepare_reward(reward_fn)
        return build_consumer_generation(
            cfg,
            rank,
            trainer.engine.policy,
            tokenizer,
            prompts,
            reward_fn,
            BufferClient(RayHandle(buffer)),
            recorder,
        )


class EvaluatorRole:
    """Evaluates the newest published weights on the eval sets, on request."""

    def __init__(self, spec: EvaluatorSpec) -> None:
        """``spec``: :class:`zbrl.launch.worker_specs.EvaluatorSpec`."""
        from zbrl.evaluation.evaluator import EvalSet, Evaluator

        timer = StartupTimer()
        cfg = RunConfig.model_validate(spec.cfg_data)
        _setup_process(cfg, 999)
        self.recorder = SpanRecorder("evaluator", "evaluator")
        self.hub = HubClient(RayHandle(spec.hub))
        with timer.part("files"):
            model_dir, tokenizer_dir = local_dirs(cfg, spec.model, spec.tokenizer)
            local_run_dir = node_run_dir(
                spec.run_dir, spec.model.driver_node, cfg.logging.cache_dir
            )
        self.mirror = head_mirror(spec.head_files, spec.model.driver_node, local_run_dir)
        with timer.part("backend"):
            backend = build_backend(cfg, model_dir, tokenizer_dir)
        self.backend = backend
        self.receiver = build_receiver(
            cfg.transport.weight_sync,
            WeightStoreClient(RayHandle(spec.store)),
            self.recorder,
            initial_version=spec.initial_version,
            member="evaluator",
            broadcast=broadcast_settings(cfg, node_address()),
        )
        params = eval_sampling_params(cfg)
        self.evaluator = Evaluator(
            backend,
            build_episode_runner(cfg, backend, params.max_new_tokens),
            build_eval_reward_fn(cfg),
            [EvalSet(name, prompts) for name, prompts in spec.eval_sets.items()],
            params,
            batch_size=cfg.eval.batch_size,
            out_dir=local_run_dir / EVAL_DIR,
        )
        timer.record(self.recorder)

    def evaluate(self, step: int, version: int) -> dict[str, dict[str, float]]:
        from zbrl.telemetry.spans import EVAL

        if version > self.receiver.loaded_version:
            if not self.receiver.wait_for(version, timeout=300):
                raise TimeoutError(f"evaluator: weights version {version} never arrived")
            self.receiver.receive_into(self.backend.load_weights)
        with self.recorder.span(EVAL, step=step, version=self.receiver.loaded_version):
            torch.manual_seed(12345)  # the same sampling noise for every eval
            results = self.evaluator.run(step)
        if self.mirror is not None:
            self.mirror.file_written(self.evaluator.out_file(step))
        self.hub.add_spans(self.recorder.drain())
        return results

    def placement(self) -> dict[str, Any]:
        """Where this worker runs (node id, address, host, pid)."""
        return describe_process()

    def close(self) -> None:
        self.receiver.close()
