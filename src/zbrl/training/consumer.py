"""The Consumer: pulls train batches, trains, bumps the policy version, publishes weights.

Publishing never blocks the next step: the weights are copied to a staging buffer on this thread
and sent by the publisher's background thread (any ``WeightPublisher`` of
:mod:`zbrl.transport.weight_sync`). Data-parallel consumers (the ranks of the engine's process
group) each run this loop in lockstep: every rank takes the same step's batch from the buffer and
trains its slice; the version moves on every rank together; only rank 0 publishes weights,
reports metrics and rollouts and writes checkpoints (the gathering of full weights is a
collective every rank joins).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from zbrl.rng import rng_state, set_rng_state
from zbrl.telemetry.spans import CHECKPOINT, TRAIN_STEP, WAIT_FOR_DATA, SpanRecorder
from zbrl.training.checkpoint import BUFFER_FILE, TRAINER_FILE, prune, save_checkpoint
from zbrl.training.train_step import Trainer
from zbrl.transport.clients import BufferClient
from zbrl.transport.weight_sync.base import WeightPublisher
from zbrl.types import TrainBatch

POLL_TIMEOUT_S = 1.0
"""Longest single wait in ``take``; the consumer waits again until a batch or the end comes."""


@dataclass(frozen=True)
class ConsumerSettings:
    """Loop settings of a consumer (every field is filled by
    ``zbrl.assembly.settings.consumer_settings``; none has a default of its own)."""

    groups_per_step: int
    max_steps: int | None
    checkpoint_dir: str
    save_interval: int
    """Save a checkpoint every this many steps (0: never)."""
    save_keep: int
    """Checkpoints kept (the newest; 0 keeps all)."""
    save_final: bool
    log_rollout_interval: int
    """Report decoded rollouts every this many steps (0: never)."""
    rollouts_per_log: int
    uid_log: str | None
    """JSONL file that gets one line per step: the uids trained and their policy versions."""


class RunFileMirror(Protocol):
    """Copies what a consumer writes into its run directory to another place (a consumer on a
    node that is not the driver's copies it to the driver's: :mod:`zbrl.launch.head_files`)."""

    def checkpoint_saved(self, path: Path, keep: int) -> None:
        """The complete checkpoint ``path`` was written; keep the newest ``keep`` there."""

    def line_appended(self, path: Path, line: str) -> None:
        """``line`` was appended to the file ``path``."""


@dataclass(frozen=True)
class ThreadLending:
    """A lone consumer's torch threads for a step: its own, plus ``per_producer`` for each
    producer parked on its node for the step (``TrainBatch.parked_producers``), at most
    ``cap`` (the node's cores)."""

    own: int
    per_producer: int
    cap: int

    def for_step(self, parked: int) -> int:
        return max(self.own, min(self.cap, self.own + parked * self.per_producer))


class IdleGeneration(Protocol):
    """A consumer's own generation while it waits for data (``rollout.consumers_generate``;
    :class:`zbrl.rollout.consumer_generation.ConsumerGeneration`)."""

    @property
    def producer_index(self) -> int:
        """The producer id of the groups it makes."""
        ...

    def wants(self) -> bool:
        """Whether to generate while waiting for the next step (its planner's decision)."""
        ...

    def generate(self, version: int) -> bool:
        """One small generation batch with the weights of ``version``; True when it made
        groups (False: admission had no room, or it ended)."""
        ...

    def step_done(self, train_s: float, step_s: float, groups: list[Any]) -> dict[str, float]:
        """A step trained ``groups`` in ``train_s`` of its ``step_s`` seconds (from the previous
        step's end); its generation metrics."""
        ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


@dataclass
class ConsumerResult:
    """What a consumer reports when it stops."""

    steps: int
    groups_trained: int
    samples_trained: int
    final_checkpoint: str | None
    partial_batches: int
    stopped: bool = False
    """The run was interrupted (``RolloutBuffer.request_stop``): it saved a resume point."""


class Consumer:
    """Trains on rollout batches as they arrive."""

    def __init__(
        self,
        settings: ConsumerSettings,
        trainer: Trainer,
        buffer: BufferClient,
        publisher: WeightPublisher,
        recorder: SpanRecorder,
        *,
        tokenizer: Any = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        on_rollouts: Callable[[int, list[dict[str, Any]]], None] | None = None,
        lending: ThreadLending | None = None,
        mirror: RunFileMirror | None = None,
        generation: IdleGeneration | None = None,
    ) -> None:
        """``lending``: borrow parked producers' cores for a step (None: never); ``mirror``:
        copies each checkpoint and uid-log line elsewhere once written (None: nowhere);
        ``generation``: generate while the buffer cannot fill the next step (None: never)."""
        self.settings = settings
        self.trainer = trainer
        self.buffer = buffer
        self.publisher = publisher
        self.recorder = recorder
        self.tokenizer = tokenizer
        self.on_step = on_step
        self.on_rollouts = on_rollouts
        self.lending = lending
        self.mirror = mirror
        self.generation = generation
        self._step_end: float | None = None
        self.version = 0
        self.groups_trained = 0
        self.samples_trained = 0
        self.partial_batches = 0

    def run(self) -> ConsumerResult:
        final, stopped = None, False
        try:
            while self.settings.max_steps is None or self.version < self.settings.max_steps:
                status, batch = self._wait_for_batch()
                if batch is None:
                    stopped = status == "stop"
                    break
                self._train(batch)
            self.publisher.flush()
            if self.settings.save_final or stopped:
                final = str(self._save())
        finally:
            if not stopped:  # when stopped, the buffer's contents go into the checkpoint first
                self.buffer.close()  # producers still waiting for admission stop now
        return ConsumerResult(
            steps=self.version,
            groups_trained=self.groups_trained,
            samples_trained=self.samples_trained,
            final_checkpoint=final,
            partial_batches=self.partial_batches,
            stopped=stopped,
        )

    @property
    def rank(self) -> int:
        return self.trainer.engine.rank

    def _wait_for_batch(self) -> tuple[str, TrainBatch | None]:
        if self.generation is not None:
            return self._wait_generating(self.generation)
        with self.recorder.span(WAIT_FOR_DATA, step=self.version):
            return self._take_blocking()

    def _take(self, timeout: float) -> tuple[str, TrainBatch | None]:
        engine = self.trainer.engine
        return self.buffer.take(
            self.settings.groups_per_step, timeout, self.version, engine.rank, engine.world_size
        )

    def _take_blocking(self) -> tuple[str, TrainBatch | None]:
        while True:
            status, batch = self._take(POLL_TIMEOUT_S)
            if status != "timeout":
                return status, batch

    def _wait_generating(self, generation: IdleGeneration) -> tuple[str, TrainBatch | None]:
        """Wait for the next step's batch, generating while it cannot be taken and the planner
        says so: look (without waiting) → generate one small batch → look again; the looks are
        idle time, the generation is not. After a batch that made nothing (admission had no
        room) the next look waits as a plain take does. Data-parallel ranks decide together:
        after each look every rank joins one all-reduce of (this rank has the step's batch,
        rank 0's decision), so every rank computes the same answer: all generate or none does,
        and all stop at the same look."""
        engine = self.trainer.engine
        made = True
        while True:
            want = generation.wants()
            timeout = 0.0 if want and made else POLL_TIMEOUT_S
            with self.recorder.span(WAIT_FOR_DATA, step=self.version):
                status, batch = self._take(timeout)
            if engine.world_size > 1:
                ready, rank0_wants = engine.all_reduce(
                    [float(status != "timeout"), float(want and engine.rank == 0)], "max"
                )
                if ready:  # some rank has the step's batch: it is popped and shared, take it
                    if status == "timeout":
                        with self.recorder.span(WAIT_FOR_DATA, step=self.version):
                            status, batch = self._take_blocking()
                    return status, batch
                want = bool(rank0_wants)
            elif status != "timeout":
                return status, batch
            made = want and generation.generate(self.version)

    def _train(self, batch: TrainBatch) -> None:
        start = time.time()
        threads = self._borrow(batch.parked_producers)
        with self.recorder.span(
            TRAIN_STEP, step=self.version, groups=len(batch.groups), threads=threads
        ):
            metrics = self.trainer.train(batch.groups, policy_version=self.version)
        train_s = time.time() - start
        self.version += 1
        if self.lending is not None:
            torch.set_num_threads(self.lending.own)  # before the parked producers wake
            metrics["lent_threads"] = float(threads - self.lending.own)
        # admission first: it travels while the weights are copied and announced (a producer
        # needs both; it waits for the weights after its reservation)
        self.buffer.advance_version(self.version)
        weights = self.trainer.engine.full_state_dict()  # a collective on sharded engines
        if self.rank == 0:
            self.publisher.publish(self.version, weights)
        self.groups_trained += len(batch.groups)
        self.samples_trained += sum(g.group_size for g in batch.groups)
        self.partial_batches += int(batch.partial)
        self._log_uids(batch)
        if self.settings.save_interval and self.version % self.settings.save_interval == 0:
            self._save()
        if self.generation is not None:
            now = time.time()
            step_s = now - (self._step_end if self._step_end is not None else start)
            metrics.update(self.generation.step_done(now - start, step_s, batch.groups))
            self._step_end = now
        if self.rank != 0:
            return  # rank 0 reports the step (its metrics are the whole step's)
        metrics.update(_batch_metrics(batch, self.version - 1, train_s))
        metrics["sample_utilization"] = batch.sample_utilization
        if self.on_step is not None:
            self.on_step(self.version, metrics)
        every = self.settings.log_rollout_interval
        if self.on_rollouts is not None and every and self.version % every == 0:
            self.on_rollouts(self.version, self._rollout_records(batch))

    def _borrow(self, parked: int) -> int:
        """Threads for this step (see :class:`ThreadLending`)."""
        if self.lending is None:
            return torch.get_num_threads()
        threads = self.lending.for_step(parked)
        torch.set_num_threads(threads)
        return threads

    def _rollout_records(self, batch: TrainBatch) -> list[dict[str, Any]]:
        """Decoded samples of a few groups, for ``rollouts.jsonl``."""
        records = []
        for group in batch.groups[: self.settings.rollouts_per_log]:
            prompt = (
                self.tokenizer.decode(group.prompt_ids, skip_special_tokens=False)
                if self.tokenizer is not None
                else None
            )
            records.append(
                {
                    "step": self.version,
                    "uid": group.uid,
                    "policy_version": group.policy_version,
                    "prompt": prompt,
                    "responses": group.response_texts,
                    "rewards": group.rewards,
                    "ans_acc": group.ans_acc,
                    "truncated": group.truncated,
                    "version_changes": [
                        version_changes(group.versions(g)) for g in range(group.group_size)
                    ],
                    **_episode_fields(group),
                }
            )
        return records

    def _log_uids(self, batch: TrainBatch) -> None:
        if self.settings.uid_log is None or self.trainer.engine.rank != 0:
            return
        line = {
            "step": self.version,
            "uids": [g.uid for g in batch.groups],
            "policy_versions": [g.policy_version for g in batch.groups],
        }
        Path(self.settings.uid_log).parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(line) + "\n"
        with open(self.settings.uid_log, "a", encoding="utf-8") as f:
            f.write(text)
        if self.mirror is not None:
            self.mirror.line_appended(Path(self.settings.uid_log), text)

    def _save(self) -> Path:
        """A resumable checkpoint of this step (see :mod:`zbrl.training.checkpoint`): the model,
        this consumer's state and the buffer's, taken together between steps."""
        engine = self.trainer.engine
        path = Path(self.settings.checkpoint_dir) / f"step-{self.version}"
        with self.recorder.span(CHECKPOINT, step=self.version):
            trainer_state = self.state()  # every rank: a collective on sharded engines
            state = (
                {TRAINER_FILE: trainer_state, BUFFER_FILE: self.buffer.state()}
                if not self.rank
                else {}
            )
            saved = save_checkpoint(engine, self.tokenizer, path, state=state)
            if self.rank == 0:
                prune(self.settings.checkpoint_dir, self.settings.save_keep)
                if self.mirror is not None:  # inside the span: a stop waits for the copy
                    self.mirror.checkpoint_saved(saved, self.settings.save_keep)
        if engine.world_size > 1:
            # no rank may take the next step's batch before rank 0 captured the buffer's state
            engine.all_reduce([0.0], "sum")
        return saved

    # -- resume ----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a resumed consumer needs (a plain picklable dict, tensors on CPU): ``version``
        (policy version = steps done), the counters ``groups_trained``, ``samples_trained`` and
        ``partial_batches``, ``rng`` (this process's generators) and ``engine`` (the engine's
        ``state_dict`` without the policy weights, which the checkpoint holds in Hugging Face
        format: optimizer, LR schedule, step count) and ``generation`` (its own generation's
        prompt stream, :meth:`IdleGeneration.state`; None without it). Take it between steps."""
        engine = self.trainer.engine.state_dict()
        engine.pop("policy", None)
        return {
            "version": self.version,
            "groups_trained": self.groups_trained,
            "samples_trained": self.samples_trained,
            "partial_batches": self.partial_batches,
            "rng": rng_state(),
            "engine": engine,
            "generation": None if self.generation is None else self.generation.state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` of a consumer whose engine was built from the same
        checkpoint's weights and the same config."""
        self.trainer.engine.load_state_dict(state["engine"])
        self.version = state["version"]
        self.groups_trained = state["groups_trained"]
        self.samples_trained = state["samples_trained"]
        self.partial_batches = state["partial_batches"]
        if self.generation is not None and state.get("generation") is not None:
            self.generation.load_state(state["generation"])  # (before the RNG: it sets it too)
        set_rng_state(state["rng"])


def version_changes(versions: torch.Tensor) -> list[list[int]]:
    """``[[token_index, version], ...]``: the first token of a response and every token whose
    version differs from the one before it (one entry: one version sampled the whole
    response; ``[]`` for an empty one). For the rollout log."""
    values = versions.tolist()
    return [[i, v] for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def token_staleness(groups: list, trained_at: int) -> dict[str, float]:
    """Per-token staleness of a batch: ``trained_at`` minus the version that sampled each model
    token (environment tokens of episodes excluded), its mean and maximum over the tokens."""
    behind = []
    for group in groups:
        for g in range(group.group_size):
            versions = group.versions(g)
            if group.loss_masks is not None:
                versions = versions[group.loss_masks[g].bool()]
            behind.append(trained_at - versions)
    flat = torch.cat(behind) if behind else torch.zeros(0, dtype=torch.long)
    if not flat.numel():
        return {"token_staleness_mean": 0.0, "token_staleness_max": 0.0}
    return {
        "token_staleness_mean": float(flat.float().mean()),
        "token_staleness_max": float(flat.max()),
    }


def _batch_metrics(batch: TrainBatch, trained_at: int, train_s: float) -> dict[str, float]:
    groups = batch.groups
    behind = [trained_at - g.policy_version for g in groups]
    samples = [(r, f, a, n) for g in groups for r, f, a, n in _per_sample(g)]
    count = max(1, len(samples))
    tokens = sum(len(g.prompt_ids) * g.group_size + sum(g.response_lengths) for g in groups)
    out = {
        "staleness_mean": sum(behind) / max(1, len(behind)),
        "staleness_max": float(max(behind, default=0)),
        "train_reward": sum(s[0] for s in samples) / count,
        "train_ans_acc": sum(s[2] for s in samples) / count,
        "groups": float(len(groups)),
        "raw_groups": float(batch.raw_groups),
        "partial_batch": float(batch.partial),
        "train_tokens_per_s": tokens / train_s if train_s > 0 else 0.0,
        "truncated_frac": sum(t for g in groups for t in g.truncated) / count,
    }
    out.update(token_staleness(groups, trained_at))
    # reward, format_acc, ans_acc, response_length (pre-filter means); reward_timeouts,
    # reward_failed, failed_episodes (counts)
    out.update(batch.raw_metrics)
    out.update(_env_metrics(groups, count))
    return out


def _env_metrics(groups, samples: int) -> dict[str, float]:
    """Multi-turn episodes: ``env/<event>`` per episode (turns, tool calls, tool errors, turn and
    token limits) over the trained groups."""
    totals: dict[str, float] = {}
    for g in groups:
        for name, n in g.env_counts.items():
            totals[name] = totals.get(name, 0.0) + n
    return {f"env/{name}": n / samples for name, n in sorted(totals.items())}


def _episode_fields(group) -> dict[str, Any]:
    """Turn records in the rollout log, for the groups that carry them (episodes with environment
    turns): each response's turns (model turns trained, environment turns not, with their tool
    calls) and the trained token count per response. A plain response's line stays as it is."""
    if not group.episodes:
        return {}
    return {
        "turns": group.episodes,
        "trained_tokens": [int(m.sum()) for m in group.loss_masks],
        "response_tokens": group.response_lengths,
    }


def _per_sample(group):
    return zip(group.rewards, group.format_acc, group.ans_acc, group.response_lengths)
