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
from zbrl.telemetry.spans import GENERATE, PUSH, SCORE, WAIT_FOR_WEIGHTS, SpanRecorder
from zbrl.transport.clients import BufferClient
from zbrl.transport.weight_sync.base import WeightReceiver
from zbrl.types import EncodedPrompt, Reservation, RolloutGroup

POLL_TIMEOUT_S = 1.0
"""Longest single wait for admission or for weights; the producer waits again until it gets them
(or the buffer closes)."""


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


@dataclass
class ProducerResult:
    """What a producer reports when it stops."""

    index: int
    groups: int
    samples: int
    weight_versions_loaded: int
    weight_sync_latencies_s: list[float]


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
        *,
        sampler: ShardedSampler | None = None,
        stream: str = "",
        resume_in_buffer: bool = True,
    ) -> None:
        """``episodes``: runs and scores the episodes (single-turn: ``single_turn_episodes``
        of :mod:`zbrl.rollout.single_turn`); their model turns are generated on ``backend``.
        ``sampler``: the prompt stream (None: this producer's shard of ``prompts``);
        ``stream``: tags the group uids of that stream (``<prompt uid>@<stream>e<epoch>``; a
        consumer that generates has a stream of its own, :mod:`zbrl.training.consumer`);
        ``resume_in_buffer``: send the resume point with each ``put`` (False: whoever runs this
        producer keeps its state, as that consumer does in its checkpoints)."""
        self.settings = settings
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
        with self.recorder.span(SCORE, responses=len(chunk) * params.n):
            scored = self.episodes.score(self.reward, [p.example for p in prompts], episodes)
        return [
            self._group(prompt, epoch, ticket, group, contexts, results, version, temperature)
            for (prompt, epoch, _), ticket, group, (contexts, results) in zip(
                chunk, tickets, episodes, scored, strict=True
            )
        ]

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
    ) -> RolloutGroup:
        record = self.episodes.group_record(completions)
        token_versions = _token_versions(completions, version)
        if token_versions is not None:
            version = min((int(v.min()) for v in token_versions if v.numel()), default=version)
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
        )


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
