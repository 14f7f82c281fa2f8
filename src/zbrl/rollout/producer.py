"""The Producer: prompts in, scored RolloutGroups out, new weights swapped in between batches.

Loop: reserve admission from the buffer → make sure the loaded weights are recent enough for the
reserved tickets (the staleness bound) and swap in the newest fetched version → generate G
completions per prompt → score them (a whole chunk in one call) → push one RolloutGroup per
prompt. Receiving weights happens in a background thread (a ``WeightReceiver`` of
:mod:`zbrl.transport.weight_sync`); loading them happens here, between generation batches, and
with in-flight updates (``rollout.inflight_updates``) also between chunks of a running
generation: each response token then records the version that sampled it
(``RolloutGroup.token_versions``) and the group's ``policy_version`` is its oldest token's.

"Generate and score" is one path for every run (:mod:`zbrl.rollout.episodes`): each completion is
an episode, generated turn by turn and scored on its last model turn plus its environment's turn
rewards; a plain prompt is an episode with no environment turn (one backend call, scored as it
is). With an environment (docs/environments.md) an episode's response holds the environment's
messages too, with a loss mask over the model's turns. Every generation call goes through
:meth:`Producer._generate`; in-flight updates are refused for environments by the config, so
every turn of a batch's multi-turn episodes is generated with the same weights.

Two optional passes follow generation: ``rollout.exact_logprobs`` re-scores each group by the
trainer's own forward (the behaviour log-probs then equal the trainer's,
:mod:`zbrl.models.forward`), and ``algorithm.distill``'s teacher scores every sampled token
(:mod:`zbrl.rollout.teacher`; a group it could not score is marked ``teacher_failed`` and
dropped by the buffer).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from zbrl.data.sampler import ShardedSampler
from zbrl.rewards.base import RewardContext, RewardFunction, RewardResult
from zbrl.rng import rng_state, set_rng_state
from zbrl.rollout.backends.base import Completion, InferenceBackend, SamplingParams
from zbrl.rollout.episodes import EpisodeCompletion, EpisodeRunner
from zbrl.rollout.inflight import InflightSwap, generate_inflight
from zbrl.rollout.teacher import Teacher, TeacherCounts, TeacherSettings, load_teacher
from zbrl.telemetry.spans import (
    GENERATE,
    PUSH,
    RESCORE,
    SCORE,
    TEACHER,
    WAIT_FOR_WEIGHTS,
    SpanRecorder,
)
from zbrl.transport.clients import BufferClient
from zbrl.transport.weight_sync.base import WeightReceiver
from zbrl.types import EncodedPrompt, Reservation, RolloutGroup

POLL_TIMEOUT_S = 1.0
"""Longest single wait for admission or for weights; the producer waits again until it gets them
(or the buffer closes)."""


@dataclass(frozen=True)
class ExactLogprobs:
    """``rollout.exact_logprobs``: how the trainer computes log-probs, for the backend to
    re-score the sampled sequences the same way (:func:`zbrl.models.forward.score_rows`)."""

    dtype: str
    """The trainer's compute dtype (``model.dtype``)."""
    chunk_size: int
    """The trainer's ``training.logprob_chunk_size``."""


@dataclass(frozen=True)
class ProducerSettings:
    """What one producer needs to know (every field is filled by
    ``zbrl.assembly.settings.producer_settings``; none has a default of its own)."""

    index: int
    num_producers: int
    sampling: SamplingParams
    inference_batch_size: int
    inference_microbatch_size: int
    num_epochs: int | None
    """Epochs over the prompts (None: forever)."""
    seed: int
    shuffle: bool
    final_temperature: float | None
    """Temperature reached by annealing over the first epoch (None: no annealing)."""
    anneal_fraction: float
    """Fraction of the first epoch over which the temperature anneals."""
    inflight_chunk_tokens: int | None
    """In-flight updates: generate in chunks of this many tokens and load newer weights between
    them (None: only between generation batches)."""
    inflight_keep_cache: bool
    """In-flight updates: continue from the old weights' key/value cache after a swap (False:
    recompute it under the new weights)."""
    teacher: TeacherSettings | None
    """On-policy distillation: the teacher that scores every sampled token (None: none)."""
    exact_logprobs: ExactLogprobs | None
    """Re-score every sampled sequence with the trainer's forward (None: keep the log-probs
    the backend sampled with)."""


@dataclass
class ProducerResult:
    """What a producer reports when it stops."""

    index: int
    groups: int
    samples: int
    weight_versions_loaded: int
    weight_sync_latencies_s: list[float]
    teacher: TeacherCounts | None = None
    """The distillation teacher's calls (None without a teacher)."""


class Producer:
    """Generates and scores rollouts for its shard of the prompts."""

    def __init__(
        self,
        settings: ProducerSettings,
        prompts: list[EncodedPrompt],
        backend: InferenceBackend,
        reward: RewardFunction,
        buffer: BufferClient,
        receiver: WeightReceiver,
        recorder: SpanRecorder,
        episodes: EpisodeRunner,
        teacher: Teacher | None = None,
        *,
        sampler: ShardedSampler | None = None,
        stream: str = "",
        resume_in_buffer: bool = True,
    ) -> None:
        """``episodes``: runs and scores the episodes (single-turn: ``single_turn_episodes``
        of :mod:`zbrl.rollout.single_turn`); their model turns are generated on ``backend``.
        ``teacher``: the distillation teacher (None: loaded from ``settings.teacher`` when it
        is set). ``sampler``: the prompt stream (None: this producer's shard of ``prompts``);
        ``stream``: tags the group uids of that stream (``<prompt uid>@<stream>e<epoch>``; a
        consumer that generates has a stream of its own, :mod:`zbrl.training.consumer`);
        ``resume_in_buffer``: send the resume point with each ``put`` (False: whoever runs this
        producer keeps its state, as that consumer does in its checkpoints)."""
        self.settings = settings
        if teacher is None and settings.teacher is not None:
            teacher = load_teacher(settings.teacher)
        self.teacher = teacher
        self.stream = stream
        self.resume_in_buffer = resume_in_buffer
        self.episodes = episodes
        self.prompts = prompts
        self.backend = backend
        self.reward = reward
        self.buffer = buffer
        self.receiver = receiver
        self.recorder = recorder
        self.sampler = sampler or ShardedSampler(
            len(prompts),
            num_shards=settings.num_producers,
            shard_index=settings.index,
            seed=settings.seed,
            shuffle=settings.shuffle,
        )
        self._stream = self.sampler.iter_epochs(settings.num_epochs)
        self._first_epoch_len = max(1, len(self.sampler))
        self._taken = 0
        self.groups_pushed = 0
        self.samples_pushed = 0
        self.versions_loaded = 0

    def run(self) -> ProducerResult:
        """Produce until the data ends or the buffer closes."""
        try:
            while self.step():
                pass
        finally:
            self.buffer.producer_finished(self.settings.index)
        return ProducerResult(
            index=self.settings.index,
            groups=self.groups_pushed,
            samples=self.samples_pushed,
            weight_versions_loaded=self.versions_loaded,
            weight_sync_latencies_s=list(self.receiver.latencies_s),
            teacher=None if self.teacher is None else self.teacher.counts,
        )

    def step(self) -> bool:
        """One generation batch; False when there is nothing more to do."""
        reservation = self._reserve()
        if reservation is None:
            return False
        return self._fill(reservation)

    def try_step(self, n: int) -> int | None:
        """One generation batch of at most ``n`` prompts if admission has room now (it does not
        wait): the groups pushed (0: no room), None when the buffer is closed or stopping or
        the prompt stream ended."""
        reservation = self.buffer.reserve(self.settings.index, n, 0.0)
        if reservation is None:
            return None
        if not reservation.tickets:
            return 0
        before = self.groups_pushed
        if not self._fill(reservation):
            return None
        return self.groups_pushed - before

    def _fill(self, reservation: Reservation) -> bool:
        """Generate, score and push the groups of ``reservation`` (releasing the tickets the
        prompt stream cannot fill); False when it had no prompt left."""
        batch = self._next_prompts(len(reservation.tickets))
        if len(batch) < len(reservation.tickets):
            self.buffer.release(reservation.tickets[len(batch) :])
        if not batch:
            return False
        self._ensure_weights(reservation.min_version)
        version = self.receiver.loaded_version
        groups: list[RolloutGroup] = []
        imbs = self.settings.inference_microbatch_size
        for start in range(0, len(batch), imbs):
            chunk = batch[start : start + imbs]
            tickets = reservation.tickets[start : start + len(chunk)]  # the rest were released
            groups += self._rollout(chunk, tickets, version)
        self.groups_pushed += len(groups)
        self.samples_pushed += sum(g.group_size for g in groups)
        with self.recorder.span(PUSH, groups=len(groups)):
            # the resume point right after these groups
            self.buffer.put(groups, self.state() if self.resume_in_buffer else None)
        return True

    # -- resume ----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a resumed producer needs (a plain picklable dict): ``sampler`` (its shard's
        position, see ``ShardedSampler.state``), ``prompts_taken`` (prompts taken so far: the
        temperature schedule's clock), ``rng`` (this process's generators, see
        :mod:`zbrl.rng`) and the counters ``groups_pushed``, ``samples_pushed`` and
        ``versions_loaded``. Valid between steps (every taken prompt pushed): the producer sends
        it with each ``put``, and the buffer keeps the latest (see :mod:`zbrl.transport.buffer`).
        The loaded weight version is not part of it: a resumed producer's receiver starts at the
        version its backend was loaded with."""
        return {
            "index": self.settings.index,
            "sampler": self.sampler.state(),
            "prompts_taken": self._taken,
            "rng": rng_state(),
            "groups_pushed": self.groups_pushed,
            "samples_pushed": self.samples_pushed,
            "versions_loaded": self.versions_loaded,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` of a producer built with the same settings and prompts."""
        self.sampler.load_state(state["sampler"])
        self._stream = self.sampler.iter_epochs(self.settings.num_epochs)
        self._taken = state["prompts_taken"]
        self.groups_pushed = state["groups_pushed"]
        self.samples_pushed = state["samples_pushed"]
        self.versions_loaded = state["versions_loaded"]
        set_rng_state(state["rng"])

    # -- steps -----------------------------------------------------------------------------------

    def _reserve(self) -> Reservation | None:
        """Wait for admission (idle: the consumer must advance first)."""
        n = self.settings.inference_batch_size
        with self.recorder.span(WAIT_FOR_WEIGHTS, reason="admission"):
            while True:
                res = self.buffer.reserve(self.settings.index, n, POLL_TIMEOUT_S)
                if res is None or res.tickets:
                    return res

    def _ensure_weights(self, min_version: int) -> None:
        if self.receiver.loaded_version < min_version:
            with self.recorder.span(WAIT_FOR_WEIGHTS, reason="staleness", need=min_version):
                while not self.receiver.wait_for(min_version, timeout=POLL_TIMEOUT_S):
                    pass
        self._swap_in()

    def _swap_in(self) -> int:
        """Load the newest received version if it is newer than the loaded one; the version
        loaded now."""
        if self.receiver.receive_into(self.backend.load_weights):
            self.versions_loaded += 1
        return self.receiver.loaded_version

    def _next_prompts(self, n: int) -> list[tuple[EncodedPrompt, int, float]]:
        out = []
        for epoch, index in _take(self._stream, n):
            out.append((self.prompts[index], epoch, self._temperature(epoch)))
            self._taken += 1
        return out

    def _temperature(self, epoch: int) -> float:
        s = self.settings
        t0 = s.sampling.temperature
        if s.final_temperature is None or epoch > 0:
            return t0 if s.final_temperature is None else s.final_temperature
        frac = min(1.0, self._taken / (s.anneal_fraction * self._first_epoch_len))
        return t0 + (s.final_temperature - t0) * frac

    def _generate(
        self, prompt_ids: list[list[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """The one place the producer has its backend generate (every model turn of every
        episode): with the loaded weights or, with in-flight updates (the config turns them off
        for environments, whose episodes are swapped between batches), in chunks that the
        producer advances, swapping in newer weights between them
        (:func:`zbrl.rollout.inflight.generate_inflight`)."""
        chunk = self.settings.inflight_chunk_tokens
        if chunk is None:
            return self.backend.generate(prompt_ids, params)
        swaps = InflightSwap(chunk, self._swap_in, keep_cache=self.settings.inflight_keep_cache)
        return generate_inflight(self.backend, prompt_ids, params, swaps)

    def _rollout(
        self, chunk: list[tuple[EncodedPrompt, int, float]], tickets: list[int], version: int
    ) -> list[RolloutGroup]:
        temperature = chunk[0][2]
        params = _with_temperature(self.settings.sampling, temperature)
        prompts = [p for p, _, _ in chunk]
        with self.recorder.span(GENERATE, prompts=len(chunk), version=version):
            episodes = self.episodes.run(self._generate, prompts, params, version)
        if self.settings.exact_logprobs is not None:
            self._rescore(prompts, episodes, temperature)
        with self.recorder.span(SCORE, responses=len(chunk) * params.n):
            scored = self.episodes.score(self.reward, [p.example for p in prompts], episodes)
        teacher = self._teacher_logprobs(prompts, episodes)
        return [
            self._group(
                prompt, epoch, ticket, group, contexts, results, version, temperature, scores
            )
            for (prompt, epoch, _), ticket, group, (contexts, results), scores in zip(
                chunk, tickets, episodes, scored, teacher, strict=True
            )
        ]

    def _rescore(
        self,
        prompts: list[EncodedPrompt],
        episodes: list[list[EpisodeCompletion]],
        temperature: float,
    ) -> None:
        """Replace each completion's behaviour log-probs on the model's tokens by the trainer's
        numbers for the same weights (``rollout.exact_logprobs``): one group per forward pass,
        the micro-batch the trainer runs it in."""
        exact = self.settings.exact_logprobs
        with self.recorder.span(RESCORE, sequences=sum(len(g) for g in episodes)):
            for p, group in zip(prompts, episodes, strict=True):
                scored = self.backend.score_exact(
                    [
                        (list(p.prompt_ids if c.prompt_ids is None else c.prompt_ids), c.token_ids)
                        for c in group
                    ],
                    temperature=temperature,
                    dtype=getattr(torch, exact.dtype),
                    chunk_size=exact.chunk_size,
                )
                for c, logp in zip(group, scored, strict=True):
                    c.logprobs = (
                        torch.where(c.loss_mask, logp, 0.0) if c.loss_mask.numel() else logp
                    )

    def _teacher_logprobs(
        self, prompts: list[EncodedPrompt], episodes: list[list[EpisodeCompletion]]
    ) -> list[list[torch.Tensor | None] | None]:
        """Per group: the teacher's log-probs of each completion's tokens (None where its call
        failed), in batched calls over the whole chunk; None per group without a teacher."""
        if self.teacher is None:
            return [None] * len(episodes)
        sequences = [
            (list(p.prompt_ids if c.prompt_ids is None else c.prompt_ids), c.token_ids)
            for p, group in zip(prompts, episodes, strict=True)
            for c in group
        ]
        with self.recorder.span(TEACHER, sequences=len(sequences)) as attrs:
            calls = self.teacher.counts.calls
            flat = self.teacher.score(sequences)
            attrs["calls"] = self.teacher.counts.calls - calls
        out, start = [], 0
        for group in episodes:
            out.append(flat[start : start + len(group)])
            start += len(group)
        return out

    def _group(
        self,
        prompt: EncodedPrompt,
        epoch: int,
        ticket: int,
        completions: list[EpisodeCompletion],
        contexts: list[RewardContext],
        results: list[RewardResult],
        version: int,
        temperature: float,
        teacher: list[torch.Tensor | None] | None = None,
    ) -> RolloutGroup:
        record = self.episodes.group_record(completions)
        teacher_failed = 0 if teacher is None else sum(t is None for t in teacher)
        token_versions = _token_versions(completions, version)
        segments = (
            [c.segments for c in completions] if any(c.segments for c in completions) else None
        )
        oldest = [v for v in token_versions or () if v.numel()]
        oldest += [
            s.token_versions for c in completions for s in c.segments if s.response_ids.numel()
        ]
        if oldest:
            version = min(int(v.min()) for v in oldest)
        return RolloutGroup(
            uid=f"{prompt.uid}@{self.stream}e{epoch}",
            prompt_ids=list(
                prompt.prompt_ids
                if completions[0].prompt_ids is None
                else completions[0].prompt_ids
            ),
            response_ids=[c.token_ids for c in completions],
            behaviour_logprobs=[c.logprobs for c in completions],
            rewards=[r.reward for r in results],
            format_acc=[r.format_acc for r in results],
            ans_acc=[r.ans_acc for r in results],
            reward_timeouts=sum(r.timed_out for r in results),
            reward_failed=sum(r.failed for r in results),
            episode_failures=sum(c.failure is not None for c in completions),
            failure=first_failure(completions, results)
            or (TEACHER_FAILURE if teacher_failed else None),
            truncated=[ctx.truncated for ctx in contexts],
            policy_version=version,
            temperature=temperature,
            producer=self.settings.index,
            ticket=ticket,
            response_texts=record.response_texts,
            created_at=time.time(),
            loss_masks=record.loss_masks,
            episodes=record.turns,
            env_counts=record.env_counts,
            token_versions=token_versions,
            segments=segments,
            teacher_logprobs=_teacher_tensors(teacher, completions),
            teacher_failed=teacher_failed,
        )


def _teacher_tensors(
    teacher: list[torch.Tensor | None] | None, completions: list[EpisodeCompletion]
) -> list[torch.Tensor] | None:
    """The teacher's log-probs per completion; a failed one is NaN (its group is dropped by
    the buffer, so it is never trained)."""
    if teacher is None:
        return None
    return [
        t if t is not None else torch.full((int(c.token_ids.numel()),), float("nan"))
        for t, c in zip(teacher, completions, strict=True)
    ]


TEACHER_FAILURE = (
    "teacher_failed: the teacher's scoring call raised (the producer's log has its error)"
)
"""A group's failure when only the distillation teacher failed on it."""


def first_failure(completions: list[EpisodeCompletion], results: list[RewardResult]) -> str | None:
    """A group's first failure as ``kind: detail``: its first failed episode's, else its first
    failed reward's (``reward_failed: <reason>``); None when nothing failed."""
    failed = next((c.failure for c in completions if c.failure is not None), None)
    if failed is not None:
        return failed
    reward = next((r for r in results if r.failed), None)
    if reward is None:
        return None
    return f"reward_failed: {reward.metadata.get('reward_error', 'no reason given')}"


def _token_versions(
    completions: list[EpisodeCompletion], version: int
) -> list[torch.Tensor] | None:
    """Each completion's per-token versions when the backend recorded them (in-flight
    updates; a completion without them was sampled by ``version``), else None."""
    if all(c.versions is None for c in completions):
        return None
    return [
        c.versions
        if c.versions is not None
        else torch.full((int(c.token_ids.numel()),), version, dtype=torch.long)
        for c in completions
    ]


def _take(stream: Iterator[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    out = []
    for item in stream:
        out.append(item)
        if len(out) == n:
            break
    return out


def _with_temperature(params: SamplingParams, temperature: float) -> SamplingParams:
    if temperature == params.temperature:
        return params
    return replace(params, temperature=temperature)
