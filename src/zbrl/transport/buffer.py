"""The bounded, staleness-controlled rollout buffer between producers and consumers.

A plain thread-safe class: tests use it in one process; ``zbrl.launch`` wraps it as a threaded Ray
actor so that blocked producers and consumers wait on its condition variable (no spinning).

Admission (the capacity rule of the fully asynchronous systems): a producer may start a group only
while ``effective_started < (version + max_staleness + 1) * groups_per_step``, where
``effective_started`` counts tickets granted minus tickets dropped (filtered, released, stale).
Consumers take groups in ticket order, so a ticket whose effective index is ``e`` is trained at a
step ``<= e // groups_per_step``; the reservation therefore tells the producer to generate with
weights of at least version ``e // groups_per_step - max_staleness``. Together these guarantee that
no group trained at version v was generated before version v - max_staleness; ``take`` re-checks
the bound and drops (and counts) any group that would break it.

Reward failures. A group with a response whose reward failed (``RolloutGroup.reward_failed``: a
service, worker, judge or sandbox gave no score; the reward is NaN, never a number that looks
like a score) is dropped on arrival whatever the filters, counted
(``groups_dropped_reward_failed``, ``responses_reward_failed``), and its ticket freed as a
filtered group's is: admission then lets a producer make a replacement group, so the batch is
filled with scored groups (or, at the end of the data, comes smaller).

Failed episodes. A group with an episode that failed before it could be scored (an agent's
timeout, crash or malformed result: ``RolloutGroup.episode_failures``) is dropped the same way.
Both mean "this group has no trustworthy score", yet they stay two reasons with their own
counters (``reward_failed``: ``groups_dropped_reward_failed`` and the responses;
``failed_episodes``: ``groups_failed_episodes`` and the episodes) because they have different
causes and fixes: a reward failure is the scorer's (a reward service, worker, judge or sandbox;
fix the reward or its ``reward.timeout_s`` / ``reward.workers``), an episode failure the
agent's or environment's (``environment.timeout_s``, the agent's code; ``env/agent_*`` say which
kind). A user who sees only one merged count could not tell which to fix. Both are also counted
in the step metrics over every group that arrived (``reward_failed``, ``failed_episodes``):
the trained groups' ``env/agent_failures`` can never show a failed episode, since its group is
never trained. A failed episode's placeholder reward (0) is not a score: the pre-filter
``reward`` mean leaves its group out, as it leaves out the responses whose reward failed.

Teacher failures. A group the distillation teacher could not score
(``RolloutGroup.teacher_failed``: a teacher call raised) is dropped on arrival the same way, with
its own counters (``groups_dropped_teacher_failed``, ``responses_teacher_failed``): its teacher
log-probs are NaN, never trained.

Per-token versions (in-flight updates, ``RolloutGroup.token_versions``) leave this rule as it is:
a group's ``policy_version`` is the version of its *oldest* token. A producer loads at least the
reservation's version before it starts and versions only go up while it generates, so every
token's version is at or above the group's, which is at or above the reservation's minimum; the
bound checked on the oldest token therefore holds for every token, and a group is never dropped
as stale because of tokens that newer weights sampled.

Data-parallel consumers (``ranks > 1`` in ``take``) train one batch per step together: the first
rank that asks for step ``s`` pops the batch exactly as a single consumer would (same ticket
order, same staleness check, counted once) and the buffer keeps it until every rank has taken it;
each rank trains its slice (``zbrl.training.train_step.rank_slice``; packed under a token
budget, the groups are dealt to ranks by packed tokens, ``rank_groups``). Ranks move from step
to step in lockstep (their gradient collectives pair up), so when step ``s`` is popped the
version is ``s`` and the guarantee above holds for every rank's slice. An end of data or a stop
is shared the same way (every rank trains step ``s`` or none does).

Resume and restarts. Each producer sends its resume point (``Producer.state``: sampler position,
RNG, counters) with every ``put``; the buffer stores it under the same lock as the groups, so its
:meth:`state` always pairs the groups it holds with the producer states that produced exactly
them. A producer holds at most one reservation, and it takes its prompts in stream order and puts
a reservation's groups at once, so the prompts of its pending tickets are exactly those after its
last resume point. :meth:`reclaim` drops a producer's pending tickets and returns its resume
point: a restarted (or resumed) producer that continues from there regenerates those prompts
under new tickets, and no prompt is lost or trained twice.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from zbrl.algorithms.filters import group_in_accuracy_range
from zbrl.transport.failure_log import FailureLog
from zbrl.types import Reservation, RolloutGroup, TrainBatch

_DROPPED = object()

TakeResult = tuple[str, TrainBatch | None]
"""``("batch", batch)``, ``("end", None)``, ``("stop", None)`` or ``("timeout", None)`` (see
``RolloutBuffer.take``)."""


class RawGroup(NamedTuple):
    """One arrived group's figures for the step's pre-filter metrics (:func:`_mean_raw`)."""

    reward: float
    """Mean over its scored responses; NaN when it has none (or a failed episode)."""
    format_acc: float
    ans_acc: float
    response_length: float
    reward_timeouts: int
    reward_failed: int
    failed_episodes: int = 0
    """Episodes that failed before a score (0 in a buffer state saved before it was counted)."""


@dataclass(frozen=True)
class BufferSettings:
    """What the buffer needs from the run configuration (every field is filled by
    ``zbrl.assembly.shared_settings.buffer_settings``; none has a default of its own)."""

    groups_per_step: int
    max_staleness: int
    num_producers: int
    filter_range: tuple[float, float] | None
    """Accuracy range a group must fall in to be kept (None: keep all)."""
    dynamic_batching: bool
    """Filter by ``filter_range`` here (else the trainer masks such groups in the loss)."""
    drop_all_truncated_groups: bool
    capacity: int | None
    """Groups held at most (None: only the staleness rule bounds it)."""


@dataclass
class BufferStats:
    """Counters of everything that entered and left the buffer."""

    groups_received: int = 0
    samples_generated: int = 0
    groups_filtered_accuracy: int = 0
    groups_filtered_truncated: int = 0
    groups_failed_episodes: int = 0
    """Groups dropped because an episode failed without a score (an agent's failure)."""
    episodes_failed: int = 0
    """Episodes that failed without a score, over every group received."""
    groups_dropped_stale: int = 0
    groups_dropped_reward_failed: int = 0
    """Groups with a response whose reward failed (no score), dropped on arrival: never trained
    (the admission rule counts the drop, so a producer makes a replacement group)."""
    responses_reward_failed: int = 0
    """Responses whose reward failed, over every group received."""
    groups_dropped_teacher_failed: int = 0
    """Groups with a response the distillation teacher could not score, dropped on arrival the
    same way: never trained with a made-up teacher log-prob."""
    responses_teacher_failed: int = 0
    """Responses the teacher could not score, over every group received."""
    responses_reward_failed_trained: int = 0
    """Responses whose reward failed in the groups handed to a consumer (0 unless the rule
    above were broken; measured, for the run summary)."""
    tickets_released: int = 0
    tickets_reissued: int = 0
    """Pending tickets of a dead or resumed producer, dropped; their prompts get new tickets."""
    groups_trained: int = 0
    samples_trained: int = 0
    partial_batches: int = 0
    per_reason: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self.__dict__.items() if isinstance(v, int)}
        out["sample_utilization"] = (
            self.samples_trained / self.samples_generated if (self.samples_generated) else 0.0
        )
        return out


class RolloutBuffer:
    """Bounded buffer of RolloutGroups with staleness admission, filtering and clean shutdown."""

    def __init__(self, settings: BufferSettings) -> None:
        if settings.groups_per_step < 1:
            raise ValueError("groups_per_step must be >= 1")
        self.settings = settings
        self._cond = threading.Condition()
        self._version = 0
        self._nodes: dict[int, str] = {}
        """Producer → the node it said it runs on (in ``reserve``)."""
        self._next_ticket = 0
        self._dropped = 0
        self._slots: dict[int, object] = {}  # ticket -> None (pending) | RolloutGroup | _DROPPED
        self._head = 0  # lowest ticket not yet consumed
        self._finished: set[int] = set()
        self._closed = False
        self._shared: dict[int, tuple[TakeResult, set[int]]] = {}  # step -> result, ranks to go
        self._stopping = False
        self._owners: dict[int, int] = {}  # pending ticket -> the producer that reserved it
        self._producer_states: dict[int, dict[str, Any]] = {}  # producer -> its last resume point
        # per group: mean reward (NaN when no response has a score), format_acc, ans_acc,
        # response length; reward timeouts and failures (counts)
        self._raw: list[RawGroup] = []
        self.stats = BufferStats()
        self.failures = FailureLog()
        """Failed groups per cause and the current streak (this buffer's life)."""

    # -- producers -----------------------------------------------------------------------------

    def reserve(
        self, producer: int, n: int, timeout: float | None = None, node: str = ""
    ) -> Reservation | None:
        """Block until admission allows at least one group; grant up to ``n`` tickets.

        Returns None when the buffer is closed, and an empty reservation on timeout. ``node``:
        where the producer runs (see :meth:`take`).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._ended_for_producers() and self._room() < 1:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return Reservation(tickets=[], min_version=0)
                self._cond.wait(remaining)
            self._nodes[producer] = node
            if self._ended_for_producers():
                return None
            k = min(n, self._room())
            first_effective = self._next_ticket - self._dropped
            tickets = list(range(self._next_ticket, self._next_ticket + k))
            for t in tickets:
                self._slots[t] = None
                self._owners[t] = producer
            self._next_ticket += k
            last_effective = first_effective + k - 1
            b, s = self.settings.groups_per_step, self.settings.max_staleness
            return Reservation(tickets=tickets, min_version=max(0, last_effective // b - s))

    def put(self, groups: list[RolloutGroup], producer_state: dict[str, Any] | None = None) -> None:
        """Store generated groups under their tickets, dropping those the filters reject.

        ``producer_state``: the sending producer's resume point right after these groups (see the
        module docstring); kept for :meth:`state` and :meth:`reclaim`.
        """
        with self._cond:
            for group in groups:
                if self._slots.get(group.ticket, _DROPPED) is not None:
                    raise ValueError(
                        f"group {group.uid} carries unknown or used ticket {group.ticket}"
                    )
                self._owners.pop(group.ticket, None)
                self._account_raw(group)
                reason = self._filter_reason(group)
                self._log_failure(group, reason)
                if reason is None:
                    self._slots[group.ticket] = group
                else:
                    self.stats.per_reason[reason] = self.stats.per_reason.get(reason, 0) + 1
                    self._drop(group.ticket)
            if producer_state is not None and groups:
                self._producer_states[groups[0].producer] = producer_state
            self._cond.notify_all()

    def release(self, tickets: list[int]) -> None:
        """Give back tickets a producer will not fill (its data ended)."""
        with self._cond:
            for t in tickets:
                if self._slots.get(t, _DROPPED) is None:
                    self.stats.tickets_released += 1
                    self._owners.pop(t, None)
                    self._drop(t)
            self._cond.notify_all()

    def reclaim(self, producer: int | None = None) -> dict[int, dict[str, Any] | None]:
        """Drop the pending tickets of ``producer`` (of every producer when None) and return each
        such producer's last resume point (None: it never put anything, so it starts its shard
        from the beginning). For a producer that died, or for every producer of a resumed run."""
        with self._cond:
            owners = dict(self._owners)
            which = sorted(set(owners.values()) | set(self._producer_states))
            if producer is not None:
                which = [producer]
            for ticket, owner in owners.items():
                if owner in which and self._slots.get(ticket, _DROPPED) is None:
                    self.stats.tickets_reissued += 1
                    self._drop(ticket)
                    del self._owners[ticket]
            for p in which:
                self._finished.discard(p)
            self._cond.notify_all()
            return {p: self._producer_states.get(p) for p in which}

    def producer_finished(self, producer: int) -> None:
        with self._cond:
            self._finished.add(producer)
            self._cond.notify_all()

    # -- consumers -----------------------------------------------------------------------------

    def take(
        self,
        n: int | None = None,
        timeout: float | None = None,
        step: int = 0,
        rank: int = 0,
        ranks: int = 1,
        node: str = "",
    ) -> TakeResult:
        """Block until ``n`` effective groups are ready in ticket order and return them.

        Returns ``("batch", batch)``; when every producer has finished and fewer remain, they come
        as a partial batch. Returns ``("end", None)`` when nothing is left or the buffer is closed,
        ``("stop", None)`` once :meth:`request_stop` was called (what is buffered stays, for a
        checkpoint) and ``("timeout", None)`` when ``timeout`` passes first. With ``ranks > 1``
        each of the ``ranks`` data-parallel consumers asks for ``step`` (its version) as ``rank``
        and all get the same batch (or end, or stop), popped once (see the module docstring).
        Asking for ``step`` = version + 1 also moves admission to version ``step`` (as
        :meth:`advance_version`, which a consumer sends without waiting for it).

        A batch says how many producers on the consumer's ``node`` are parked for the whole
        step (``TrainBatch.parked_producers``): when admission has no room and no ticket is in
        flight, no producer has anything to generate, and nothing but the consumer's next version
        can give them any (room only grows with the version, with drops, which only puts and
        releases of tickets in flight cause, or with the pops of ``take``, already done); a lone
        consumer may use their cores until it advances.
        """
        n = n or self.settings.groups_per_step
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if step == self._version + 1:  # asking for the next step means this one is done
                self._advance(step)  # (the consumer's advance_version may be on its way)
            if ranks > 1 and step not in self._shared and step != self._version:
                raise ValueError(
                    f"consumer rank {rank} asked for step {step} at version {self._version}: "
                    "data-parallel ranks must take each step's batch in lockstep"
                )
            while True:
                if ranks > 1 and step in self._shared:  # (also after waiting: another rank
                    return self._take_shared(step, rank)  # may have popped it meanwhile)
                if self._stopping:
                    return self._share(("stop", None), step, rank, ranks)
                ready, complete = self._ready_prefix(n)
                if len(ready) >= n or (complete and ready):
                    batch = self._pop_batch(ready[:n], partial=len(ready) < n)
                    if batch is not None:
                        if ranks == 1:
                            batch.parked_producers = self._parked_on(node)
                        return self._share(("batch", batch), step, rank, ranks)
                    continue  # every group was stale and dropped: look again
                if complete or self._closed:
                    return self._share(("end", None), step, rank, ranks)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return "timeout", None
                self._cond.wait(remaining)

    def _share(self, result: TakeResult, step: int, rank: int, ranks: int) -> TakeResult:
        """Keep ``result`` for the other ranks of a data-parallel step."""
        if ranks > 1:
            self._shared[step] = (result, set(range(ranks)) - {rank})
        return result

    def _take_shared(self, step: int, rank: int) -> TakeResult:
        result, waiting = self._shared[step]
        if rank not in waiting:
            raise ValueError(f"consumer rank {rank} took the batch of step {step} twice")
        waiting.discard(rank)
        if not waiting:
            del self._shared[step]
        return result

    def advance_version(self, version: int) -> None:
        """The consumers finished a step: admission moves forward."""
        with self._cond:
            self._advance(version)

    def _advance(self, version: int) -> None:
        if version > self._version:
            self._version = version
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiter; further reservations and takes return None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def request_stop(self) -> None:
        """The run is being interrupted: producers get no more admission (``reserve`` returns
        None) and consumers get ``("stop", None)`` from ``take``; nothing buffered is dropped."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    # -- introspection -------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def snapshot(self) -> dict[str, float]:
        with self._cond:
            out = self.stats.as_dict()
            out["version"] = float(self._version)
            out["buffered_groups"] = float(
                sum(isinstance(v, RolloutGroup) for v in self._slots.values())
            )
            out["pending_groups"] = float(sum(v is None for v in self._slots.values()))
            return out

    def failure_log(self) -> dict[str, Any]:
        """:class:`~zbrl.transport.failure_log.FailureLog` as a dict (for the driver)."""
        with self._cond:
            return self.failures.as_dict()

    def producer_state(self, producer: int) -> dict[str, Any] | None:
        """The last resume point ``producer`` sent with a ``put`` (None before its first)."""
        with self._cond:
            return self._producer_states.get(producer)

    # -- resume ----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this buffer is (a plain picklable dict).

        Fields: ``version`` (policy version admission counts from), ``next_ticket`` (the next
        ticket to grant), ``dropped`` (tickets dropped so far: filtered, released, stale; with
        ``next_ticket`` it gives ``effective_started``), ``head`` (lowest ticket not consumed),
        ``ready`` (ticket → stored RolloutGroup, not yet taken), ``pending`` (tickets granted and
        not yet filled or released), ``owners`` (pending ticket → the producer that reserved it),
        ``producer_states`` (producer → its last resume point), ``dropped_tickets`` (tickets at or
        above ``head`` already dropped), ``finished`` (producers that reported the end of their
        data), ``raw`` (per-group pre-filter metrics not yet reported with a batch) and ``stats``
        (the counters). Not included: the settings (they come from the config) and whether the
        buffer is closed or stopping (a loaded buffer is open).

        Pending tickets belong to reservations in flight: restored as pending, the consumer waits
        for them in ticket order, so whoever resumes calls :meth:`reclaim` and restarts each
        producer from the resume point it returns.
        """
        with self._cond:
            ready = {t: v for t, v in self._slots.items() if isinstance(v, RolloutGroup)}
            return {
                "version": self._version,
                "next_ticket": self._next_ticket,
                "dropped": self._dropped,
                "head": self._head,
                "ready": ready,
                "pending": sorted(t for t, v in self._slots.items() if v is None),
                "owners": dict(self._owners),
                "producer_states": dict(self._producer_states),
                "dropped_tickets": sorted(t for t, v in self._slots.items() if v is _DROPPED),
                "finished": sorted(self._finished),
                "raw": list(self._raw),
                "stats": asdict(self.stats),
            }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` of a buffer built with the same settings."""
        slots: dict[int, object] = {t: _DROPPED for t in state["dropped_tickets"]}
        slots.update({t: None for t in state["pending"]})
        slots.update(state["ready"])
        with self._cond:
            self._version = state["version"]
            self._next_ticket = state["next_ticket"]
            self._dropped = state["dropped"]
            self._head = state["head"]
            self._slots = dict(sorted(slots.items()))
            self._finished = set(state["finished"])
            self._owners = dict(state["owners"])
            self._producer_states = dict(state["producer_states"])
            self._raw = [RawGroup(*r) for r in state["raw"]]
            stats = dict(state["stats"])
            stats["per_reason"] = dict(stats["per_reason"])
            self.stats = BufferStats(**stats)
            self._cond.notify_all()

    # -- internals -----------------------------------------------------------------------------

    def _ended_for_producers(self) -> bool:
        return self._closed or self._stopping

    def _parked_on(self, node: str) -> int:
        """Producers on ``node`` with nothing to do until the version moves (0 unless all)."""
        if self._owners or self._room() >= 1:
            return 0
        return sum(n == node for n in self._nodes.values())

    def _room(self) -> int:
        b, s = self.settings.groups_per_step, self.settings.max_staleness
        effective_started = self._next_ticket - self._dropped
        room = (self._version + s + 1) * b - effective_started
        if self.settings.capacity is not None:
            outstanding = sum(v is not _DROPPED for v in self._slots.values())
            room = min(room, self.settings.capacity - outstanding)
        return room

    def _drop(self, ticket: int) -> None:
        self._slots[ticket] = _DROPPED
        self._dropped += 1

    def _filter_reason(self, group: RolloutGroup) -> str | None:
        st = self.settings
        if group.reward_failed:  # a failure is never trained as a score, whatever the filters
            self.stats.groups_dropped_reward_failed += 1
            return "reward_failed"
        if group.episode_failures:
            self.stats.groups_failed_episodes += 1
            return "failed_episodes"
        if group.teacher_failed:
            self.stats.groups_dropped_teacher_failed += 1
            return "teacher_failed"
        if st.dynamic_batching and not group_in_accuracy_range(group.ans_acc, st.filter_range):
            self.stats.groups_filtered_accuracy += 1
            return "accuracy_out_of_range"
        if st.drop_all_truncated_groups and all(group.truncated):
            self.stats.groups_filtered_truncated += 1
            return "all_truncated"
        return None

    def _log_failure(self, group: RolloutGroup, reason: str | None) -> None:
        if reason in ("reward_failed", "failed_episodes", "teacher_failed"):
            self.failures.failed(group.failure or f"{reason}: no message")
        else:
            self.failures.scored()

    def _account_raw(self, group: RolloutGroup) -> None:
        g = group.group_size
        self.stats.groups_received += 1
        self.stats.samples_generated += g
        self.stats.responses_reward_failed += group.reward_failed
        self.stats.episodes_failed += group.episode_failures
        self.stats.responses_teacher_failed += group.teacher_failed
        lengths = group.response_lengths
        # a failed episode's reward is a placeholder: its group has no score to average
        scores = [] if group.episode_failures else [r for r in group.rewards if not math.isnan(r)]
        self._raw.append(
            RawGroup(
                sum(scores) / len(scores) if scores else math.nan,
                sum(group.format_acc) / g,
                sum(group.ans_acc) / g,
                sum(lengths) / g,
                group.reward_timeouts,
                group.reward_failed,
                group.episode_failures,
            )
        )

    def _ready_prefix(self, n: int) -> tuple[list[int], bool]:
        """Tickets of ready groups from the head in order, and whether nothing more can come."""
        ready: list[int] = []
        t = self._head
        while t < self._next_ticket and len(ready) < n:
            slot = self._slots.get(t, _DROPPED)
            if slot is None:
                return ready, False
            if isinstance(slot, RolloutGroup):
                ready.append(t)
            t += 1
        all_done = len(self._finished) >= self.settings.num_producers
        no_more = all_done and t >= self._next_ticket
        return ready, no_more

    def _pop_batch(self, tickets: list[int], partial: bool) -> TrainBatch | None:
        floor_version = self._version - self.settings.max_staleness
        groups: list[RolloutGroup] = []
        for t in tickets:
            group = self._slots[t]
            assert isinstance(group, RolloutGroup)
            if group.policy_version < floor_version:
                self.stats.groups_dropped_stale += 1
                self._drop(t)
                continue
            groups.append(group)
            self._slots[t] = _DROPPED  # consumed; keeps effective_started unchanged
        last = tickets[-1]
        for t in range(self._head, last + 1):
            self._slots.pop(t, None)
        self._head = last + 1
        raw = self._raw
        self._raw = []
        self.stats.groups_trained += len(groups)
        self.stats.samples_trained += sum(g.group_size for g in groups)
        self.stats.responses_reward_failed_trained += sum(g.reward_failed for g in groups)
        if partial:
            self.stats.partial_batches += 1
        self._cond.notify_all()
        if not groups:
            return None
        return TrainBatch(
            groups=groups,
            step=self._version,
            raw_groups=len(raw),
            raw_metrics=_mean_raw(raw),
            partial=partial,
            sample_utilization=self.stats.as_dict()["sample_utilization"],
        )


def _mean_raw(raw: list[RawGroup]) -> dict[str, float]:
    """Means over the groups that arrived since the last batch (``reward`` over the groups with
    a score); ``reward_timeouts``, ``reward_failed`` (responses without a score) and
    ``failed_episodes`` (episodes that failed before a score) are sums."""
    if not raw:
        return {}
    n = len(raw)
    means = {
        "format_acc": sum(r.format_acc for r in raw) / n,
        "ans_acc": sum(r.ans_acc for r in raw) / n,
        "response_length": sum(r.response_length for r in raw) / n,
    }
    scored = [r.reward for r in raw if not math.isnan(r.reward)]
    if scored:  # no score arrived: no reward figure (a NaN would read as one)
        means["reward"] = sum(scored) / len(scored)
    means["reward_timeouts"] = float(sum(r.reward_timeouts for r in raw))
    means["reward_failed"] = float(sum(r.reward_failed for r in raw))
    means["failed_episodes"] = float(sum(r.failed_episodes for r in raw))
    return means
