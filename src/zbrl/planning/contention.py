"""Turn spans measured on time-shared cores into single-core work (``zbrl plan --run-cores``).

On a CPU run every worker runs one torch thread; when more workers are busy than the machine has
cores, each got only part of a core and its spans are longer than its work. With ``C`` cores and
``D(t)`` workers busy at time ``t`` (a non-idle span on their main track), a busy worker advances
at ``min(1, C / D(t))``; a span's work is the integral of that over the span. This is the
simulation's sharing rule for ``--cores`` (:func:`fair_shares`, docs/planning.md) run backwards,
with every worker counted as one thread: the ranks of a measured data-parallel run are not
grouped into one competitor here, so their lockstep losses end up in the background load.

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


class SpeedProfile:
    """``min(1, cores / (busy workers + background))`` over the run, piecewise constant."""

    def __init__(self, spans: list[Span], cores: int, background: float = 0.0) -> None:
        if cores < 1:
            raise ValueError(f"run cores must be >= 1, got {cores}")
        if background < 0:
            raise ValueError(f"background load must be >= 0, got {background}")
        per_worker: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for s in spans:
            if s.thread == MAIN_THREAD and s.name not in IDLE_SPANS:
                per_worker[s.worker].append((s.start, s.end))
        deltas: dict[float, int] = defaultdict(int)
        for intervals in per_worker.values():
            for a, b in merge_intervals(intervals):
                deltas[a] += 1
                deltas[b] -= 1
        self.xs = sorted(deltas)
        self.speeds: list[float] = []  # on [xs[i], xs[i+1])
        self.cumulative = [0.0]  # integral of the speed from xs[0] to xs[i]
        busy = 0
        for i, x in enumerate(self.xs):
            busy += deltas[x]
            demand = busy + background
            speed = 1.0 if demand <= cores else cores / demand
            self.speeds.append(speed)
            if i + 1 < len(self.xs):
                self.cumulative.append(self.cumulative[-1] + speed * (self.xs[i + 1] - x))

    def integral(self, t: float) -> float:
        """Integral of the speed from the first breakpoint to ``t``."""
        if not self.xs or t <= self.xs[0]:
            return 0.0
        i = bisect.bisect_right(self.xs, t) - 1
        return self.cumulative[i] + self.speeds[i] * (t - self.xs[i])

    def work(self, span: Span) -> float:
        return self.integral(span.end) - self.integral(span.start)


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
    lo, hi = 0.0, max(cores, 1.0) * 2
    for _ in range(60):  # the cores given out grow with λ: bisect for the λ that gives all
        mid = (lo + hi) / 2
        if sum(min(w * mid, c) for w, c in zip(weights, caps)) < cores:
            lo = mid
        else:
            hi = mid
    return [min(w * hi, c) for w, c in zip(weights, caps)][: len(threads)]
