"""Timed spans: what every worker was doing, and when.

Each role (producer, consumer, buffer, ...) owns one :class:`SpanRecorder`. The recorder lives
inside the worker process; the driver periodically calls ``drain()`` on each worker (through Ray)
and appends the returned plain dicts to the run's ``timeline.jsonl``. Nothing here imports Ray.

Times are wall-clock seconds (``time.time()``) so that spans recorded by different processes on
one machine share a time axis. Across nodes the clocks differ by their NTP skew (usually a few
milliseconds): each worker's own busy/idle accounting is unaffected, only the cross-worker
alignment in the timeline plot is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

GENERATE = "generate"
"""Producer: generating completions (including behaviour log-probs)."""
SCORE = "score"
"""Producer: running the reward functions on generated completions."""
RESCORE = "rescore"
"""Producer: re-scoring the sampled sequences by the trainer's forward
(``rollout.exact_logprobs``)."""
TEACHER = "teacher"
"""Producer: the distillation teacher scoring the sampled tokens (``algorithm.distill``)."""
PUSH = "push"
"""Producer: handing finished rollout groups to the buffer."""
WAIT_FOR_DATA = "wait_for_data"
"""Consumer: blocked until a train batch is available."""
TRAIN_STEP = "train_step"
"""Consumer: forward/backward/optimizer step on one train batch."""
PUBLISH_WEIGHTS = "publish_weights"
"""Consumer: sending a new weight version (runs on a background thread track)."""
WAIT_FOR_WEIGHTS = "wait_for_weights"
"""Producer: held back; ``attrs["reason"]`` is ``staleness`` (a weight version it needs has not
arrived) or ``admission`` (the buffer admits nothing until the consumer advances)."""
LOAD_WEIGHTS = "load_weights"
"""Producer: swapping received weights into the inference engine."""
EVAL = "eval"
"""Evaluation on held-out prompts."""
STARTUP = "startup"
"""Model/engine construction before the first real work (the report knows the name; zbrl's own
roles do not record it today)."""
RESTART = "restart"
"""A worker's process died: from the death being noticed until its replacement is ready."""
CHECKPOINT = "checkpoint"
"""Consumer: writing a resumable checkpoint (the stop grace is sized from these)."""

IDLE_SPANS: frozenset[str] = frozenset({WAIT_FOR_DATA, WAIT_FOR_WEIGHTS, RESTART})
"""Span names that count as idle time when they occur on a worker's main thread."""

CPU_S = "cpu_s"
"""Attribute of a busy span: CPU seconds of the thread that ran it (:meth:`SpanRecorder.span`)."""

MAIN_THREAD = "main"
"""The track name of a worker's main loop; only this track's idle spans count as idle."""

_REQUIRED_KEYS = ("worker", "role", "name", "start", "end")


@dataclass
class Span:
    """One timed interval on one worker's thread track (times in wall-clock seconds)."""

    worker: str
    role: str
    name: str
    start: float
    end: float
    thread: str = MAIN_THREAD
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def is_idle(self) -> bool:
        """True when this span counts as idle time of its worker (idle name on the main track)."""
        return self.name in IDLE_SPANS and self.thread == MAIN_THREAD

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "role": self.role,
            "name": self.name,
            "start": self.start,
            "end": self.end,
            "thread": self.thread,
            "attrs": dict(self.attrs),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Span:
        missing = [k for k in _REQUIRED_KEYS if k not in d]
        if missing:
            raise ValueError(f"span record {d!r} lacks required key(s) {missing}")
        return cls(
            worker=str(d["worker"]),
            role=str(d["role"]),
            name=str(d["name"]),
            start=float(d["start"]),
            end=float(d["end"]),
            thread=str(d.get("thread") or MAIN_THREAD),
            attrs=dict(d.get("attrs") or {}),
        )


def as_span(s: Span | dict[str, Any]) -> Span:
    """Accept either a :class:`Span` or its ``to_dict()`` form."""
    return s if isinstance(s, Span) else Span.from_dict(s)


class SpanRecorder:
    """Records spans for one worker; safe to use from several threads at once.

    ``clock`` must return wall-clock seconds comparable across processes (default ``time.time``).
    """

    def __init__(self, worker: str, role: str, clock: Callable[[], float] = time.time) -> None:
        self.worker = worker
        self.role = role
        self.clock = clock
        self._lock = threading.Lock()
        self._spans: list[Span] = []

    @contextmanager
    def span(self, name: str, thread: str = MAIN_THREAD, **attrs: Any) -> Iterator[dict[str, Any]]:
        """Time the body as span ``name`` on track ``thread``.

        Yields the span's ``attrs`` dict so the body can add attributes (e.g. token counts). The
        span is recorded even when the body raises; it then carries ``attrs["error"]`` = the
        exception's type name, and the exception propagates. A busy span (any name not in
        :data:`IDLE_SPANS`) also carries ``attrs["cpu_s"]``: the CPU seconds its thread used
        (``time.thread_time``), which ``zbrl plan --run-cores`` takes as the span's work on one
        core when the worker ran one torch thread.
        """
        start = self.clock()
        cpu_start = time.thread_time()
        try:
            yield attrs
        except BaseException as e:
            attrs["error"] = type(e).__name__
            raise
        finally:
            if name not in IDLE_SPANS:
                attrs[CPU_S] = time.thread_time() - cpu_start
            self.record(name, start, self.clock(), thread=thread, **attrs)

    def record(
        self, name: str, start: float, end: float, thread: str = MAIN_THREAD, **attrs: Any
    ) -> Span:
        """Record an already-timed span (e.g. measured elsewhere)."""
        if end < start:
            raise ValueError(
                f"span {name!r} on {self.worker!r} ends ({end}) before it starts ({start})"
            )
        span = Span(self.worker, self.role, name, float(start), float(end), thread, dict(attrs))
        with self._lock:
            self._spans.append(span)
        return span

    def drain(self) -> list[dict[str, Any]]:
        """Return (as plain dicts, ready to cross a process boundary) and forget all spans
        recorded since the previous drain."""
        with self._lock:
            spans, self._spans = self._spans, []
        return [s.to_dict() for s in spans]

    def __len__(self) -> int:
        with self._lock:
            return len(self._spans)
