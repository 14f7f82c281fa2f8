"""Busy/idle accounting per worker: the numbers behind the "zero bubble" claim.

Definition (for a window ``[start, end]``, usually the whole run):

- a worker's **idle time** is the total time covered by spans named in ``IDLE_SPANS``
  (``wait_for_data``, ``wait_for_weights``) on its **main** thread track, with overlapping idle
  spans merged (never counted twice) and clipped to the window;
- its **idle fraction** is ``idle_s / (end - start)``;
- **busy time** is reported per span name: every other span, plus any span on a background thread
  track (e.g. ``publish_weights`` sent from a background thread), merged per (track, name) and
  clipped to the window. A background thread waiting does not make the worker idle: the main loop
  is what a bubble stalls.
- **untracked time** is the part of the window not covered by any main-track span (start-up before
  the first span, bookkeeping between spans, time after the worker finished).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zbrl.telemetry.spans import MAIN_THREAD, Span, as_span

Interval = tuple[float, float]


@dataclass
class WorkerStats:
    """One worker's time budget over the analysed window (seconds)."""

    role: str
    wall_s: float
    """Length of the window, ``end - start``."""
    busy_s: dict[str, float]
    """Non-idle time per span name (all thread tracks; nested spans each count for their name)."""
    idle_s: float
    """Merged time inside ``IDLE_SPANS`` on the main thread track."""
    idle_frac: float
    """``idle_s / wall_s``."""
    background_s: dict[str, float] = field(default_factory=dict)
    """The part of ``busy_s`` recorded on background thread tracks, per span name."""
    untracked_s: float = 0.0
    """Window time covered by no main-track span at all."""


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of intervals as a sorted list of disjoint intervals (empty ones dropped)."""
    merged: list[list[float]] = []
    for a, b in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def covered_seconds(intervals: Iterable[Interval], start: float, end: float) -> float:
    """Total length of the union of ``intervals`` inside ``[start, end]``."""
    clipped = ((max(a, start), min(b, end)) for a, b in intervals)
    return sum(b - a for a, b in merge_intervals(clipped))


def span_window(spans: Iterable[Span | dict[str, Any]]) -> tuple[float, float]:
    """``(earliest start, latest end)`` over all spans; a ``ValueError`` when there are none."""
    spans = [as_span(s) for s in spans]
    if not spans:
        raise ValueError("no spans: cannot determine the run's time window")
    return min(s.start for s in spans), max(s.end for s in spans)


def worker_utilisation(
    spans: Iterable[Span | dict[str, Any]], *, start: float, end: float
) -> dict[str, WorkerStats]:
    """Per-worker busy/idle accounting over ``[start, end]`` (see the module docstring)."""
    if not end > start:
        raise ValueError(f"empty analysis window: end ({end}) must be after start ({start})")
    wall = end - start
    roles: dict[str, str] = {}
    idle: dict[str, list[Interval]] = defaultdict(list)
    main_all: dict[str, list[Interval]] = defaultdict(list)
    busy: dict[str, dict[tuple[str, str], list[Interval]]] = defaultdict(lambda: defaultdict(list))
    for s in map(as_span, spans):
        roles.setdefault(s.worker, s.role)
        iv = (s.start, s.end)
        if s.thread == MAIN_THREAD:
            main_all[s.worker].append(iv)
        if s.is_idle:
            idle[s.worker].append(iv)
        else:
            busy[s.worker][(s.thread, s.name)].append(iv)

    stats: dict[str, WorkerStats] = {}
    for worker, role in roles.items():
        busy_s: dict[str, float] = defaultdict(float)
        background_s: dict[str, float] = defaultdict(float)
        for (thread, name), ivs in busy[worker].items():
            secs = covered_seconds(ivs, start, end)
            busy_s[name] += secs
            if thread != MAIN_THREAD:
                background_s[name] += secs
        idle_s = covered_seconds(idle[worker], start, end)
        stats[worker] = WorkerStats(
            role=role,
            wall_s=wall,
            busy_s=dict(busy_s),
            idle_s=idle_s,
            idle_frac=idle_s / wall,
            background_s=dict(background_s),
            untracked_s=wall - covered_seconds(main_all[worker], start, end),
        )
    return stats


def role_idle_frac(stats: Mapping[str, WorkerStats], role: str) -> float:
    """Mean idle fraction over the workers of ``role``; a ``ValueError`` if there are none."""
    fracs = [s.idle_frac for s in stats.values() if s.role == role]
    if not fracs:
        known = ", ".join(sorted({s.role for s in stats.values()})) or "(none)"
        raise ValueError(f"no worker has role {role!r}; roles present: {known}")
    return sum(fracs) / len(fracs)


def percentile(values: Sequence[float] | Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks (as
    ``numpy.percentile``'s default); ``nan`` for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(float(v) for v in values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
