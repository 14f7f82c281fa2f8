"""Held-out accuracy against training time: time to reach an accuracy, accuracy within a budget.

A curve is a list of :class:`CurvePoint` (training steps, training seconds with evaluation time
excluded, held-out accuracy), the first one being the starting policy at 0 s. Times are those of
the evaluation points: "time to 0.75" is the training time of the first point at or above 0.75,
so its resolution is the spacing of the points (``--eval-every`` steps).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CurvePoint:
    step: int
    seconds: float
    """Training wall-clock seconds at this step, evaluation time excluded."""
    accuracy: float


def _ordered(points: Sequence[CurvePoint]) -> list[CurvePoint]:
    if not points:
        raise ValueError("an accuracy curve needs at least one point (the starting policy)")
    return sorted(points, key=lambda p: (p.seconds, p.step))


def time_to_accuracy(points: Sequence[CurvePoint], target: float) -> float | None:
    """Seconds of the first point whose accuracy is ``>= target``; None when none reaches it."""
    for p in _ordered(points):
        if p.accuracy >= target:
            return p.seconds
    return None


def accuracy_at_budget(points: Sequence[CurvePoint], budget_s: float) -> float | None:
    """Accuracy of the last point trained within ``budget_s`` seconds.

    None when the curve ends before the budget (the run was too short to say: its last point is
    earlier than ``budget_s`` and a longer run could have gone on improving)."""
    ordered = _ordered(points)
    if ordered[-1].seconds < budget_s:
        return None
    within = [p for p in ordered if p.seconds <= budget_s]
    return within[-1].accuracy if within else None


def steps_per_second(points: Sequence[CurvePoint]) -> float | None:
    """Training steps per second over the whole curve (its last point)."""
    last = _ordered(points)[-1]
    return last.step / last.seconds if last.seconds > 0 else None


def median_time(values: Sequence[float | None]) -> float | None:
    """Median of times to an accuracy over repeats, a run that never got there counting as
    infinitely slow; None when the median itself is "never"."""
    if not values:
        return None
    m = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(m) else m


def median_value(values: Sequence[float | None]) -> float | None:
    """Median of the known values (None ignored); None when there are none."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def ratio(slower: float | None, faster: float | None) -> float | None:
    """``slower / faster`` (how many times sooner ``faster`` is); None when either is unknown."""
    if slower is None or faster is None or faster <= 0:
        return None
    return slower / faster


def per_core_rate(tokens: float, seconds: float, cores: float) -> float | None:
    """Tokens per second per core of a phase that ran ``seconds`` on ``cores`` cores."""
    if seconds <= 0 or cores <= 0:
        return None
    return tokens / seconds / cores


def with_startup(table: dict[str, dict], starts: dict[str, float]) -> list[str]:
    """Lines: each system's time to each target of ``table`` (``peers_trl.json``'s: system ->
    ``time_to`` target -> training seconds or None) plus its start-up ``starts[system]``, and
    zbrl async's lead over TRL counting start-up."""
    targets = list(next(iter(table.values()))["time_to"])
    lines = ["system        start s  " + "  ".join(f"t@{t} (+start)" for t in targets)]
    totals: dict[str, dict[str, float | None]] = {}
    for system, row in table.items():
        start = starts[system]
        totals[system] = {
            t: None if row["time_to"][t] is None else row["time_to"][t] + start for t in targets
        }
        cells = [f"{'never':>15}" if v is None else f"{v:15.1f}" for v in totals[system].values()]
        lines.append(f"{system:<12} {start:8.2f}  " + "  ".join(cells))
    if "trl" in totals and "zbrl-async" in totals:
        for t in targets:
            lead = ratio(totals["trl"][t], totals["zbrl-async"][t])
            if lead is not None:
                lines.append(f"zbrl-async reaches {t} {lead:.2f}x as soon as TRL counting start-up")
    return lines
