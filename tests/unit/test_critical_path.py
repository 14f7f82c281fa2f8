"""bench/critical_path.py: the per-version chain between two steps, on synthetic timelines whose
every hand-off is known."""

from __future__ import annotations

import pytest

from critical_path import breakdown
from zbrl.telemetry.spans import Span

P = 0.5  # seconds per step


def _span(role: str, name: str, start: float, end: float, **attrs) -> Span:
    worker = f"{role}-0"
    return Span(worker, role, name, start, end, attrs=attrs)


def timeline(g: float, steps: int = 20) -> list[Span]:
    """Staleness 1, one producer: step ``s`` ends at ``P * (s + 1)``; version ``v`` is made at the
    end of step ``v - 1`` (``t0``), published 8 ms later, the reservation is back at ``t0 + 5 ms``
    and ``v`` loaded at ``t0 + 20 ms`` (when the producer waits for them), generation with ``v``
    takes ``g``, scoring and pushing 4 ms; the consumer asks 1 ms after its step ends and the
    groups reach it 10 ms after the push (2 ms when they were there already)."""
    spans: list[Span] = []
    push_end = {}
    previous_push = 0.0
    for v in range(steps):
        t0 = P * v  # the end of step v - 1
        adm_end = max(previous_push + 0.001, t0 + 0.005)
        stale_end = max(adm_end + 0.001, t0 + 0.019)
        spans += [
            _span("producer", "wait_for_weights", previous_push, adm_end, reason="admission"),
            _span("producer", "wait_for_weights", adm_end, stale_end, reason="staleness", need=v),
            _span("producer", "load_weights", stale_end, stale_end + 0.001, version=v),
            _span("producer", "generate", stale_end + 0.001, stale_end + 0.001 + g, version=v),
        ]
        gen_end = stale_end + 0.001 + g
        spans.append(_span("producer", "push", gen_end + 0.001, gen_end + 0.004, groups=8))
        previous_push = push_end[v] = gen_end + 0.004
        if v:
            spans.append(_span("consumer", "publish_weights", t0 + 0.003, t0 + 0.008, version=v))
    for s in range(1, steps):
        asked = P * s + 0.001
        got = max(asked + 0.002, push_end[s - 1] + 0.010)  # step s trains the groups of s - 1
        spans += [
            _span("consumer", "wait_for_data", asked, got, step=s),
            _span("consumer", "train_step", got, P * (s + 1), step=s, groups=8),
        ]
    spans.append(_span("consumer", "train_step", 0.0, P, step=0, groups=8))
    return spans


def _median_ms(rows: dict[str, list[float]], name: str) -> float:
    values = sorted(rows[name])
    return round(1e3 * values[len(values) // 2], 3)


def test_a_producer_waiting_for_each_version_shows_the_reservation_and_weights_latency():
    rows = breakdown(timeline(g=0.400))
    assert _median_ms(rows, "weights published") == pytest.approx(8.0)
    assert _median_ms(rows, "reservation back") == pytest.approx(5.0)
    assert _median_ms(rows, "weights loaded") == pytest.approx(20.0)
    # it pushed 424 ms after t0 and waits until t0 + P + 20 ms for the next version
    assert _median_ms(rows, "producer idle") == pytest.approx(95.0)
    assert _median_ms(rows, "generate") == pytest.approx(400.0)
    assert _median_ms(rows, "score + push") == pytest.approx(4.0)
    assert "groups to consumer" not in rows  # the groups were there before the consumer asked
    assert _median_ms(rows, "consumer idle") == pytest.approx(2.0)
    assert len(rows["weights loaded"]) == len(rows["generate"]) > 10


def test_a_consumer_waiting_for_each_batch_shows_the_groups_latency():
    rows = breakdown(timeline(g=0.490))
    assert _median_ms(rows, "groups to consumer") == pytest.approx(10.0)
    # it asked 1 ms after its step; the push ended at t0 + 514 ms, 13 ms later
    assert _median_ms(rows, "consumer idle") == pytest.approx(23.0)
    assert "reservation back" not in rows  # the producer was still generating at t0
    assert _median_ms(rows, "weights published") == pytest.approx(8.0)
