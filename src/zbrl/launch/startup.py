"""Start-up timing: where the seconds go between ``zbrl train`` starting and the end of the run's
first training step (docs/performance.md, "Start-up").

The driver marks the end of each of its phases on a :class:`StartupClock` whose origin is the
moment its process was created, so the interpreter's own start and every import count. Each
worker records a ``startup`` span (:mod:`zbrl.launch.worker_roles`), and the first generation and
the first training step are read from the run's spans. :func:`startup_summary` joins them into
the summary's ``startup_s`` (the whole, to the end of the first training step), ``startup`` (its
parts, in order, which add up to the whole), ``startup_background`` (what ran beside them: Ray's
start) and ``startup_workers`` (each worker's own span).

Nothing here imports Ray or torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from zbrl.telemetry.spans import GENERATE, MAIN_THREAD, STARTUP, TRAIN_STEP, Span, as_span

DRIVER_PHASES = (
    "imports",
    "config",
    "preflight",
    "inputs",
    "run_dir",
    "ray_init",
    "actors",
    "workers_ready",
)
"""The driver's phases, in order; each ends where the next begins:

- ``imports``: the process starts (interpreter, ``zbrl`` and the command's imports);
- ``config``: the recipe is read and validated;
- ``preflight``: :func:`zbrl.launch.preflight.preflight`, and the run dir's refusals;
- ``inputs``: the model (the warm start, built or found in the cache), the tokenizer, and every
  prompt loaded and encoded; Ray starts meanwhile, in a background thread;
- ``run_dir``: the metrics sinks opened and the run directory claimed;
- ``ray_init``: what is left of Ray's start (started or joined, the placement reserved, the
  telemetry hub, rollout buffer and weight store asked for) once the inputs are ready;
- ``actors``: the producers, consumers and evaluator asked for;
- ``workers_ready``: every worker built its state (imports, models loaded)."""

RUN_PHASES = ("first_generation", "first_train_step")
"""After the workers are ready: until the first generation ends, then until the first training
step ends (both read from the run's spans)."""


def process_start_time(pid: int | None = None) -> float | None:
    """Wall-clock time (``time.time()``) at which process ``pid`` (default: this one) was
    created, to about 10 ms; None where ``/proc`` does not say (not Linux)."""
    try:
        stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime
        since_boot = ticks / os.sysconf("SC_CLK_TCK")
        uptime = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - (uptime - since_boot)


class StartupClock:
    """The driver's phase marks. ``origin``: when start-up began (default: when this process was
    created, else now)."""

    def __init__(self, origin: float | None = None) -> None:
        if origin is None:
            origin = process_start_time() or time.time()
        self.origin = origin
        self.marks: dict[str, float] = {}
        """Phase name -> wall-clock time it ended."""
        self.background: dict[str, float] = {}
        """Seconds of what ran beside the phases (``ray_start``: Ray's start in its thread)."""

    def mark(self, phase: str) -> None:
        """Phase ``phase`` (one of :data:`DRIVER_PHASES`) ends now."""
        if phase not in DRIVER_PHASES:
            raise ValueError(f"unknown start-up phase {phase!r}; one of {DRIVER_PHASES}")
        self.marks[phase] = time.time()

    def parts(self, first_generation: float | None, first_train_step: float | None) -> dict:
        """Seconds per phase, in order: the driver's marked phases, then :data:`RUN_PHASES`
        (given as wall-clock ends, None when they did not happen). A phase that was not marked
        (``imports`` and ``config`` when the run was started from Python) is left out and its time
        counts in the next one."""
        out: dict[str, float] = {}
        last = self.origin
        ends = [(p, self.marks.get(p)) for p in DRIVER_PHASES]
        ends += [("first_generation", first_generation), ("first_train_step", first_train_step)]
        for phase, end in ends:
            if end is None:
                continue
            out[phase] = round(max(0.0, end - last), 3)
            last = max(last, end)
        return out


def first_end(spans: Iterable[Span | dict[str, Any]], name: str, since: float) -> float | None:
    """When the first main-track span ``name`` that started at or after ``since`` ended."""
    ends = [
        s.end
        for s in map(as_span, spans)
        if s.name == name and s.thread == MAIN_THREAD and s.start >= since
    ]
    return min(ends) if ends else None


def worker_startups(spans: Iterable[Span | dict[str, Any]], since: float) -> dict[str, dict]:
    """Each worker's ``startup`` span since ``since``: its seconds and the parts it recorded
    (attributes ending in ``_s``), by worker name; a worker built twice (a restart) keeps its
    first."""
    out: dict[str, dict] = {}
    for s in sorted(map(as_span, spans), key=lambda s: s.start):
        if s.name != STARTUP or s.start < since or s.worker in out:
            continue
        parts = {k: round(float(v), 3) for k, v in s.attrs.items() if k.endswith("_s")}
        out[s.worker] = {"total_s": round(s.duration, 3), **parts}
    return out


def startup_summary(clock: StartupClock, spans: list[Span | dict[str, Any]]) -> dict[str, Any]:
    """The summary's start-up entries (see the module docstring); ``startup_s`` is None when the
    run never finished a training step."""
    spans = [as_span(s) for s in spans]
    ready = clock.marks.get("workers_ready", clock.origin)
    generated = first_end(spans, GENERATE, ready)
    trained = first_end(spans, TRAIN_STEP, ready)
    return {
        "startup_s": round(trained - clock.origin, 3) if trained is not None else None,
        "startup": clock.parts(generated, trained),
        "startup_background": {k: round(v, 3) for k, v in clock.background.items()},
        "startup_workers": worker_startups(spans, clock.origin),
    }


def startup_line(summary: dict[str, Any]) -> str:
    """One log line: the whole start-up and its parts."""
    parts = ", ".join(f"{k} {v:.2f}" for k, v in summary["startup"].items())
    total = summary["startup_s"]
    head = (
        f"{total:.2f} s to the end of the first training step"
        if total is not None
        else ("no training step finished")
    )
    return f"[zbrl] start-up: {head} ({parts})"
