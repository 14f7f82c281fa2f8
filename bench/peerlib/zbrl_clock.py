"""zbrl's training clock at its checkpoints, read from a run's spans.

A checkpoint of step K holds the weights after K steps; its time is the end of the consumer's
``train_step`` span of that step (span attribute ``step`` = K - 1), measured from the first span
that is not start-up. Checkpoints are written inside that clock: :func:`save_overhead` estimates
what they cost it.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence

from zbrl.telemetry.spans import MAIN_THREAD, STARTUP, TRAIN_STEP, Span


def clock_origin(spans: Sequence[Span]) -> float:
    """Start of the first span after start-up (the first generation)."""
    work = [s.start for s in spans if s.name != STARTUP]
    if not work:
        raise ValueError("the run has no spans after start-up")
    return min(work)


def step_end_times(spans: Sequence[Span]) -> dict[int, float]:
    """Training-clock seconds at which step K (1-based: the weights after K updates) ended."""
    origin = clock_origin(spans)
    return {int(s.attrs["step"]) + 1: s.end - origin for s in spans if s.name == TRAIN_STEP}


def checkpoint_times(spans: Sequence[Span], steps: Iterable[int]) -> dict[int, float]:
    """Training-clock seconds of the checkpoints of ``steps`` (those the spans know)."""
    ends = step_end_times(spans)
    return {k: ends[k] for k in sorted(steps) if k in ends}


def save_overhead(spans: Sequence[Span], save_interval: int) -> float:
    """Seconds the checkpoints added to the consumer's main track: the gaps after the steps that
    wrote one, less the median gap after the steps that did not, summed."""
    main = sorted(
        (s for s in spans if s.role == "consumer" and s.thread == MAIN_THREAD),
        key=lambda s: s.start,
    )
    gaps: dict[bool, list[float]] = {True: [], False: []}
    for span, after in itertools.pairwise(main):
        if span.name == TRAIN_STEP:
            saved = (int(span.attrs["step"]) + 1) % save_interval == 0
            gaps[saved].append(max(0.0, after.start - span.end))
    base = statistics.median(gaps[False]) if gaps[False] else 0.0
    return sum(max(0.0, g - base) for g in gaps[True])
