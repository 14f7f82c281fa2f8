"""Turn spans measured on time-shared cores into single-core work (``zbrl plan --run-cores``).

On a CPU run every worker runs one torch thread; when more workers are busy than the machine has
cores, each got only part of a core and its spans are longer than its work. With ``C`` cores and
``D(t)`` workers busy at time ``t`` (a non-idle span on their main track), a busy worker advances
at ``min(1, C / D(t))``; a span's work is the integral of that over the span. This is the same
processor-sharing model the simulation uses for ``--cores`` (see docs/planning.md), run backwards.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import replace

from zbrl.telemetry.idle import merge_intervals
from zbrl.telemetry.spans import IDLE_SPANS, MAIN_THREAD, Span


class SpeedProfile:
    """``min(1, cores / busy workers)`` over the run, as a piecewise-constant function."""

    def __init__(self, spans: list[Span], cores: int) -> None:
        if cores < 1:
            raise ValueError(f"run cores must be >= 1, got {cores}")
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
            speed = 1.0 if busy <= cores else cores / busy
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


def as_single_core(spans: list[Span], cores: int, names: frozenset[str]) -> list[Span]:
    """``spans`` with every span named in ``names`` shortened to its single-core work."""
    profile = SpeedProfile(spans, cores)
    return [replace(s, end=s.start + profile.work(s)) if s.name in names else s for s in spans]
