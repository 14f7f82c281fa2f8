"""How close a run came to perfect overlap: the figures behind ``overlap_efficiency``.

Over the run's steady state (from the end of the consumer's first tenth of steps to the end of its
last step; the first steps carry start-up and warm-up), with ``N`` steps trained in a window of
``W`` seconds:

- ``t`` = training seconds per step: a consumer's busy time (the window less its
  ``wait_for_data``) over ``N``, the mean over consumers (data-parallel ranks step together);
- ``g`` = generation seconds per step: a producer's busy time (the window less its waits for
  admission and weights) over ``N``, the mean over producers: producers generate side by side,
  each its share of a step, so ``g`` is the wall time they need for one step's rollouts;
- a serial loop needs ``g + t`` per step, perfect overlap ``max(g, t)``: the **ideal speed-up**
  over serial is ``(g + t) / max(g, t)``; the run achieved ``(g + t) / (W / N)``;
- ``overlap_efficiency`` = achieved / ideal = ``max(g, t) * N / W``: 1.0 when the slower side
  never waited for the faster one. A synchronous run (staleness 0) sits near ``max / (g + t)``.

Busy time includes the bookkeeping between spans (untracked time is work a role did, not a
wait). ``producer_generate_frac`` is the producers' ``generate`` time over their busy time (the
rest is scoring, pushing, loading weights and bookkeeping).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from zbrl.telemetry.idle import worker_utilisation
from zbrl.telemetry.spans import GENERATE, TRAIN_STEP, Span, as_span

WARMUP_FRACTION = 0.1
"""Share of the steps left out of the steady-state window."""


@dataclass(frozen=True)
class SteadyWindow:
    """The steady-state window ``[start, end]`` and the steps that ended inside it."""

    start: float
    end: float
    steps: int
    groups: int
    """Groups trained in those steps (the ``groups`` attribute of their ``train_step`` spans)."""


@dataclass(frozen=True)
class Overlap:
    """The overlap figures of one run (see the module docstring)."""

    window_s: float
    steps: int
    generation_s_per_step: float
    training_s_per_step: float
    ideal_speedup: float
    achieved_speedup: float
    overlap_efficiency: float
    producer_generate_frac: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def steady_window(
    spans: Iterable[Span | dict], warmup_fraction: float = WARMUP_FRACTION
) -> SteadyWindow | None:
    """From the end of the step at ``warmup_fraction`` of the steps to the end of the last step
    (each step's end: the latest end of its ``train_step`` spans over data-parallel ranks). None
    when fewer than two steps were trained."""
    ends: dict[int, tuple[float, int]] = {}
    for s in map(as_span, spans):
        if s.name == TRAIN_STEP and "step" in s.attrs:
            step = int(s.attrs["step"])
            end, _ = ends.get(step, (0.0, 0))
            ends[step] = (max(end, s.end), int(s.attrs.get("groups", 0)))
    steps = sorted(ends)
    if len(steps) < 2:
        return None
    first = max(0, min(len(steps) - 2, int(len(steps) * warmup_fraction)))
    start, end = ends[steps[first]][0], ends[steps[-1]][0]
    if not end > start:
        return None
    inside = steps[first + 1 :]
    return SteadyWindow(start, end, len(inside), sum(ends[k][1] for k in inside))


def overlap(
    spans: Sequence[Span | dict], warmup_fraction: float = WARMUP_FRACTION
) -> Overlap | None:
    """The overlap figures of a run's spans; None when the run has no steady state (fewer than
    two steps) or lacks producers or consumers."""
    spans = [as_span(s) for s in spans]
    window = steady_window(spans, warmup_fraction)
    if window is None or window.steps == 0:
        return None
    stats = worker_utilisation(spans, start=window.start, end=window.end)
    producers = [w for w in stats.values() if w.role == "producer"]
    consumers = [w for w in stats.values() if w.role == "consumer"]
    if not producers or not consumers:
        return None
    wall = window.end - window.start
    n = window.steps
    producer_busy = sum(wall - w.idle_s for w in producers)
    t = sum(wall - w.idle_s for w in consumers) / len(consumers) / n
    g = producer_busy / len(producers) / n
    slower = max(g, t)
    generating = sum(w.busy_s.get(GENERATE, 0.0) for w in producers)
    return Overlap(
        window_s=wall,
        steps=n,
        generation_s_per_step=g,
        training_s_per_step=t,
        ideal_speedup=(g + t) / slower if slower > 0 else 1.0,
        achieved_speedup=(g + t) * n / wall,
        overlap_efficiency=slower * n / wall,
        producer_generate_frac=generating / producer_busy if producer_busy > 0 else 0.0,
    )
