"""The span timeline on disk (``timeline.jsonl``) and its Chrome-trace export (``trace.json``).

``timeline.jsonl`` holds one span per line (``Span.to_dict()``), appended batch by batch as the
driver drains the workers' recorders. ``write_chrome_trace`` turns spans into the Chrome Trace
Event format, which opens in https://ui.perfetto.dev or chrome://tracing: one process per worker,
one thread per track (``main`` first), times relative to the first span's start.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from zbrl.telemetry.spans import MAIN_THREAD, Span, as_span

TIMELINE_FILE = "timeline.jsonl"
TRACE_FILE = "trace.json"


class TimelineWriter:
    """Appends spans to ``RUN_DIR/timeline.jsonl`` (the directory is created if needed)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / TIMELINE_FILE

    def write(self, spans: Iterable[Span | dict[str, Any]]) -> int:
        """Append one batch of spans (dicts from ``SpanRecorder.drain()`` or :class:`Span`) and
        flush; returns the number written."""
        lines = [json.dumps(as_span(s).to_dict(), default=_json_default) for s in spans]
        if not lines:
            return 0
        with self.path.open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
        return len(lines)


def _json_default(obj: Any) -> Any:
    """Span attrs may carry numpy/torch scalars; anything else unknown becomes its repr."""
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return repr(obj)


def read_timeline(run_dir: str | os.PathLike[str]) -> list[Span]:
    """Read ``RUN_DIR/timeline.jsonl``.

    A missing file is a ``FileNotFoundError`` naming it. A malformed line is a ``ValueError``
    naming file and line, except an unterminated last line (a run killed mid-write), which is
    skipped with a warning.
    """
    path = Path(run_dir) / TIMELINE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no span timeline at {path}: is {Path(run_dir)} a zbrl run directory? "
            f"(the driver writes {TIMELINE_FILE} while the run is going)"
        )
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    spans: list[Span] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            spans.append(Span.from_dict(json.loads(line)))
        except (json.JSONDecodeError, ValueError, TypeError) as e:
            is_unterminated_tail = lineno == len(lines) and not text.endswith("\n")
            if is_unterminated_tail:
                warnings.warn(
                    f"{path}:{lineno}: skipping a truncated last line ({e})", stacklevel=2
                )
                continue
            raise ValueError(f"{path}:{lineno}: not a span record: {e}") from None
    return spans


def write_chrome_trace(
    spans: Iterable[Span | dict[str, Any]], path: str | os.PathLike[str]
) -> Path:
    """Write spans as a Chrome Trace Event JSON file and return its path.

    Events: one ``"X"`` (complete) event per span with ``ts``/``dur`` in microseconds relative to
    the earliest span start, plus one ``process_name`` metadata event per worker and one
    ``thread_name`` metadata event per (worker, thread) track.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    events = chrome_trace_events([as_span(s) for s in spans])
    doc = {"traceEvents": events, "displayTimeUnit": "ms"}
    path.write_text(json.dumps(doc, default=_json_default), encoding="utf-8")
    return path


def chrome_trace_events(spans: list[Span]) -> list[dict[str, Any]]:
    """The ``traceEvents`` list for :func:`write_chrome_trace`."""
    if not spans:
        return []
    t0 = min(s.start for s in spans)
    roles: dict[str, str] = {}
    threads: dict[str, set[str]] = {}
    for s in spans:
        roles.setdefault(s.worker, s.role)
        threads.setdefault(s.worker, set()).add(s.thread)

    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    for pid, worker in enumerate(sorted(roles, key=lambda w: (roles[w], w)), start=1):
        pids[worker] = pid
        events.append(_meta("process_name", pid, 0, f"{worker} ({roles[worker]})"))
        for tid, thread in enumerate(track_order(threads[worker])):
            tids[(worker, thread)] = tid
            events.append(_meta("thread_name", pid, tid, thread))

    for s in sorted(spans, key=lambda s: s.start):
        events.append(
            {
                "name": s.name,
                "cat": "idle" if s.is_idle else "busy",
                "ph": "X",
                "ts": _us(s.start - t0),
                "dur": _us(s.duration),
                "pid": pids[s.worker],
                "tid": tids[(s.worker, s.thread)],
                "args": {"role": s.role, **s.attrs},
            }
        )
    return events


def track_order(threads: Iterable[str]) -> list[str]:
    """Thread tracks of one worker: ``main`` first, the rest alphabetically."""
    return sorted(set(threads), key=lambda t: (t != MAIN_THREAD, t))


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def _us(seconds: float) -> float:
    us = seconds * 1e6
    return round(us, 3) if math.isfinite(us) else 0.0
