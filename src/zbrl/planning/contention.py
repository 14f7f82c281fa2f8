"""Turn spans measured on time-shared cores into single-core work (``zbrl plan --run-cores``).

On a CPU run every worker runs one torch thread; when more workers are busy than the machine has
cores, each got only part of a core and its spans are longer than its work. With ``C`` cores and
``D(t)`` workers busy at time ``t`` (a non-idle span on their main track), a busy worker advances
at ``min(1, C / D(t))``; a span's work is the integral of that over the span. This is the
simulation's sharing rule for ``--cores`` (:func:`fair_shares`, docs/planning.md) run backwards:
the busy consumers of a data-parallel run are one competitor, as they are in the simulation.

Where the spans carry their CPU time (``cpu_s``, recorded by every busy span), that is the work
itself, and comparing it with the wall time measures what the model above cannot see: the
*background load* ``E`` — other processes on the machine (Ray's own, other users') that compete
for the same cores. With it a busy worker advances at ``min(1, C / (D(t) + E))``;
:func:`background_load` finds the ``E`` under which the spans' wall times give their CPU times.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import replace

from zbrl.telemetry.idle import merge_intervals
from zbrl.telemetry.spans import CPU_S, IDLE_SPANS, MAIN_THREAD, Span

GANG_ROLE = "consumer"
"""The role whose busy workers are data-parallel ranks in lockstep: one competitor for the cores
(:func:`fair_shares`). With one consumer it is an ordinary single thread."""


class SpeedProfile:
    """Each busy worker's speed over the run, piecewise constant: :func:`fair_shares` of the cores
    among the busy single-thread workers, the busy consumer ranks as one gang, and the
    background load (with single-thread workers only: ``min(1, cores / (busy + background))``)."""

    def __init__(self, spans: list[Span], cores: int, background: float = 0.0) -> None:
        if cores < 1:
            raise ValueError(f"run cores must be >= 1, got {cores}")
        if background < 0:
            raise ValueError(f"background load must be >= 0, got {background}")
        per_worker: dict[tuple[str, bool], list[tuple[float, float]]] = defaultdict(list)
        for s in spans:
            if s.thread == MAIN_THREAD and s.name not in IDLE_SPANS:
                per_worker[(s.worker, s.role == GANG_ROLE)].append((s.start, s.end))
        deltas: dict[float, list[int]] = defaultdict(lambda: [0, 0])  # singles, ranks
        for (_, rank), intervals in per_worker.items():
            for a, b in merge_intervals(intervals):
                deltas[a][rank] += 1
                deltas[b][rank] -= 1
        self.xs = sorted(deltas)
        # per track (0: single-thread workers, 1: ranks): speed on [xs[i], xs[i+1]) and its
        # integral from xs[0] to xs[i]
        self.speeds: tuple[list[float], list[float]] = ([], [])
        self.cumulative: tuple[list[float], list[float]] = ([0.0], [0.0])
        singles = ranks = 0
        for i, x in enumerate(self.xs):
            singles += deltas[x][0]
            ranks += deltas[x][1]
            threads = [1] * singles + ([ranks] if ranks else [])
            shares = fair_shares(threads, cores, background)
            single = shares[0] if singles else 1.0
            rank = shares[-1] / ranks if ranks else 1.0
            for track, speed in enumerate((single, rank)):
                self.speeds[track].append(speed)
                if i + 1 < len(self.xs):
                    gained = speed * (self.xs[i + 1] - x)
                    self.cumulative[track].append(self.cumulative[track][-1] + gained)

    def integral(self, t: float, rank: bool = False) -> float:
        """Integral from the first breakpoint to ``t`` of a single-thread worker's speed, or of a
        consumer rank's (``rank``)."""
        if not self.xs or t <= self.xs[0]:
            return 0.0
        i = bisect.bisect_right(self.xs, t) - 1
        track = int(rank)
        return self.cumulative[track][i] + self.speeds[track][i] * (t - self.xs[i])

    def work(self, span: Span) -> float:
        rank = span.role == GANG_ROLE
        return self.integral(span.end, rank) - self.integral(span.start, rank)


def as_single_core(
    spans: list[Span], cores: int, names: frozenset[str], background: float = 0.0
) -> list[Span]:
    """``spans`` with every span named in ``names`` shortened to its single-core work: its
    recorded CPU time (``cpu_s``) where it has one, else its integral of the speed under
    processor sharing with ``background`` extra load."""
    profile = SpeedProfile(spans, cores, background)
    out = []
    for s in spans:
        if s.name in names:
            cpu = s.attrs.get(CPU_S)
            timed = isinstance(cpu, (int, float))
            s = replace(
                s, end=s.start + (min(float(cpu), s.duration) if timed else profile.work(s))
            )
        out.append(s)
    return out


MAX_BACKGROUND = 64.0


def background_load(spans: list[Span], cores: int, names: frozenset[str]) -> float | None:
    """The background load ``E`` (runnable processes besides the run's busy workers) under
    which processor sharing turns the wall time of the spans named in ``names`` into their
    recorded CPU time: the root of ``sum(work_E(span)) = sum(cpu_s)``, by bisection (the work
    falls as ``E`` grows). 0 when even ``E = 0`` gives no more work than the CPU time recorded;
    None when no such span carries ``cpu_s``."""
    timed = [s for s in spans if s.name in names and isinstance(s.attrs.get(CPU_S), (int, float))]
    if not timed:
        return None
    cpu = sum(float(s.attrs[CPU_S]) for s in timed)

    def work(e: float) -> float:
        profile = SpeedProfile(spans, cores, e)
        return sum(profile.work(s) for s in timed)

    if work(0.0) <= cpu:
        return 0.0
    lo, hi = 0.0, MAX_BACKGROUND
    if work(hi) > cpu:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        if work(mid) > cpu:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fair_shares(
    threads: list[int], cores: float, background: float = 0.0, *, gangs_as_one: bool = True
) -> list[float]:
    """Cores each busy activity gets when they share ``cores`` with ``background`` other
    runnable single-thread processes: ``threads[i]`` is activity ``i``'s threads (1 for a
    producer, ``M`` for a step of ``M`` data-parallel ranks).

    Fair sharing with caps (water-filling): every competitor gets ``w · λ`` cores, at most its
    threads, with one ``λ`` that uses all the cores (or everyone gets its threads when they fit).
    A single thread weighs 1. A gang of ranks in lockstep weighs 1 as well (``gangs_as_one``): a
    rank that reaches the all-reduce before its partners sleeps and hands its core to the other
    processes, so the gang only advances while all its ranks hold a core, and it competes like
    one thread that needs ``M`` cores to run at full speed. Without ``gangs_as_one`` a gang
    weighs ``M`` (plain processor sharing: every thread ``C / (D + E)``)."""
    weights = [1.0 if gangs_as_one else float(t) for t in threads] + [background]
    caps = [float(t) for t in threads] + [background]
    if sum(caps) <= cores:
        return [float(t) for t in threads]
    # the water level λ: competitors whose cap is reached below it (smallest cap / weight first)
    # keep their caps, the others share what is left in proportion to their weights
    left_cores, left_weight = float(cores), sum(weights)
    for w, c in sorted(zip(weights, caps), key=lambda wc: wc[1] / wc[0] if wc[0] else 0.0):
        if w == 0 or c * left_weight <= left_cores * w:  # full at a level it fits under
            left_cores -= c
            left_weight -= w
        else:
            break
    level = left_cores / left_weight if left_weight > 0 else 0.0  # 0: every cap was reached
    return [min(w * level, c) for w, c in zip(weights, caps)][: len(threads)]
