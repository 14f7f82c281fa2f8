"""A collection point for spans, step metrics and events sent by workers (a plain class; an actor
in runs, reached through ``zbrl.transport.clients.HubClient``). The driver drains it periodically
and writes the run's files."""

from __future__ import annotations

import threading
from typing import Any


class TelemetryHub:
    """Thread-safe inbox of spans, metrics and events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[dict[str, Any]] = []
        self._metrics: list[tuple[int, dict[str, float]]] = []
        self._events: list[tuple[str, Any]] = []

    def add_spans(self, spans: list[dict[str, Any]]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def add_metrics(self, step: int, metrics: dict[str, float]) -> None:
        with self._lock:
            self._metrics.append((step, dict(metrics)))

    def add_event(self, kind: str, data: Any) -> None:
        with self._lock:
            self._events.append((kind, data))

    def drain(self) -> dict[str, list]:
        with self._lock:
            out = {"spans": self._spans, "metrics": self._metrics, "events": self._events}
            self._spans, self._metrics, self._events = [], [], []
            return out
