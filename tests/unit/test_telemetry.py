"""Unit tests for zbrl.telemetry: recorder, timeline/trace files, idle accounting, sinks, report."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest

from zbrl.telemetry import (
    GENERATE,
    IDLE_SPANS,
    PUBLISH_WEIGHTS,
    RESTART,
    TRAIN_STEP,
    WAIT_FOR_DATA,
    WAIT_FOR_WEIGHTS,
    JsonlSink,
    MetricsSink,
    MultiSink,
    Span,
    SpanRecorder,
    TimelineWriter,
    busy_idle_table,
    percentile,
    read_metrics,
    read_timeline,
    render_report,
    role_idle_frac,
    worker_utilisation,
    write_chrome_trace,
)


class FakeClock:
    """Returns the queued times in order."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


# ------------------------------------------------------------------------------------- spans


def test_busy_spans_carry_the_cpu_time_of_their_thread_and_waits_do_not():
    rec = SpanRecorder("consumer-0", "consumer")
    with rec.span(TRAIN_STEP):
        deadline = time.thread_time() + 0.05
        while time.thread_time() < deadline:  # 50 ms of CPU work
            pass
    with rec.span(WAIT_FOR_DATA):
        time.sleep(0.05)  # waiting uses no CPU
    train, wait = rec.drain()
    assert 0.05 <= train["attrs"]["cpu_s"] <= train["end"] - train["start"] + 0.01
    assert "cpu_s" not in wait["attrs"]


def test_recorder_records_nested_and_raising_spans_and_drains_once():
    rec = SpanRecorder("producer-0", "producer", clock=FakeClock(1.0, 2.0, 3.0, 4.0, 5.0, 7.5))
    with rec.span(GENERATE, batch=3) as attrs:
        with rec.span("inner"):
            pass
        attrs["tokens"] = 42
    with pytest.raises(RuntimeError, match="boom"), rec.span(TRAIN_STEP):
        raise RuntimeError("boom")

    drained = rec.drain()
    assert [(d["name"], d["start"], d["end"]) for d in drained] == [
        ("inner", 2.0, 3.0),
        (GENERATE, 1.0, 4.0),
        (TRAIN_STEP, 5.0, 7.5),
    ]
    cpu = [d["attrs"].pop("cpu_s") for d in drained]  # busy spans carry their thread's CPU time
    assert all(0 <= c < 1 for c in cpu)
    assert drained[1]["attrs"] == {"batch": 3, "tokens": 42}
    assert drained[2]["attrs"] == {"error": "RuntimeError"}
    assert all(d["worker"] == "producer-0" and d["role"] == "producer" for d in drained)
    assert all(d["thread"] == "main" for d in drained)
    assert rec.drain() == []
    json.dumps(drained)  # plain data, ready to cross a process boundary


def test_span_dict_round_trip_and_validation():
    s = Span("c0", "consumer", PUBLISH_WEIGHTS, 1.0, 2.5, thread="sender", attrs={"version": 3})
    assert Span.from_dict(s.to_dict()) == s
    assert s.duration == 1.5
    assert not s.is_idle
    assert Span("c0", "consumer", WAIT_FOR_DATA, 0, 1).is_idle
    with pytest.raises(ValueError, match="end"):
        Span.from_dict({"worker": "w", "role": "r", "name": "n", "start": 0.0})
    with pytest.raises(ValueError, match="before it starts"):
        SpanRecorder("w", "r").record("x", 2.0, 1.0)


def test_recorder_is_thread_safe():
    rec = SpanRecorder("consumer-0", "consumer")
    n_threads, per_thread = 8, 500
    drained: list[dict] = []
    barrier = threading.Barrier(n_threads + 1)

    def work(i: int) -> None:
        barrier.wait()
        for j in range(per_thread):
            with rec.span("work", thread=f"t{i}", j=j):
                pass

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    barrier.wait()
    while any(t.is_alive() for t in threads):  # drain concurrently with the writers
        drained += rec.drain()
    for t in threads:
        t.join()
    drained += rec.drain()

    assert len(drained) == n_threads * per_thread
    for i in range(n_threads):
        js = [d["attrs"]["j"] for d in drained if d["thread"] == f"t{i}"]
        assert sorted(js) == list(range(per_thread))


# ---------------------------------------------------------------------------------- timeline


def _span(worker, role, name, start, end, thread="main", **attrs):
    return Span(worker, role, name, start, end, thread, attrs).to_dict()


def test_timeline_writer_appends_batches_and_reads_back(tmp_path):
    writer = TimelineWriter(tmp_path / "run")
    assert writer.write([_span("p0", "producer", GENERATE, 10.0, 11.0, tokens=5)]) == 1
    assert writer.write([]) == 0
    writer.write([Span("c0", "consumer", TRAIN_STEP, 10.5, 12.0)])
    spans = read_timeline(tmp_path / "run")
    assert [s.name for s in spans] == [GENERATE, TRAIN_STEP]
    assert spans[0].attrs == {"tokens": 5}
    assert isinstance(spans[1], Span)


def test_read_timeline_skips_truncated_last_line_but_rejects_bad_middle_line(tmp_path):
    good = json.dumps(_span("p0", "producer", GENERATE, 0.0, 1.0))
    (tmp_path / "timeline.jsonl").write_text(good + "\n" + '{"worker": "p0", "ro')
    with pytest.warns(UserWarning, match="truncated"):
        assert len(read_timeline(tmp_path)) == 1
    (tmp_path / "timeline.jsonl").write_text("not json\n" + good + "\n")
    with pytest.raises(ValueError, match=r"timeline\.jsonl:1"):
        read_timeline(tmp_path)


def test_chrome_trace_is_valid_json_with_microsecond_times(tmp_path):
    spans = [
        _span("c0", "consumer", TRAIN_STEP, 100.0, 101.5),
        _span("c0", "consumer", PUBLISH_WEIGHTS, 101.5, 101.75, thread="sender"),
        _span("p0", "producer", GENERATE, 100.25, 102.0),
        _span("p0", "producer", WAIT_FOR_WEIGHTS, 102.0, 102.5),
    ]
    path = write_chrome_trace(spans, tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    # 4 spans + 2 process_name (c0, p0) + 3 thread_name (c0/main, c0/sender, p0/main)
    assert len(events) == 4 + 2 + 3
    assert sum(e["name"] == "process_name" for e in meta) == 2
    assert sum(e["name"] == "thread_name" for e in meta) == 3

    by_name = {e["name"]: e for e in complete}
    assert by_name[TRAIN_STEP]["ts"] == 0.0
    assert by_name[TRAIN_STEP]["dur"] == pytest.approx(1_500_000.0)
    assert by_name[GENERATE]["ts"] == pytest.approx(250_000.0)
    assert by_name[WAIT_FOR_WEIGHTS]["cat"] == "idle"
    assert by_name[GENERATE]["cat"] == "busy"
    # same worker -> same pid; background thread -> its own tid
    assert by_name[TRAIN_STEP]["pid"] == by_name[PUBLISH_WEIGHTS]["pid"] != by_name[GENERATE]["pid"]
    assert by_name[TRAIN_STEP]["tid"] != by_name[PUBLISH_WEIGHTS]["tid"]
    thread_names = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"
    }
    pub = by_name[PUBLISH_WEIGHTS]
    assert thread_names[(pub["pid"], pub["tid"])] == "sender"


# -------------------------------------------------------------------------------------- idle


def test_idle_fractions_match_hand_computed_values():
    spans = [
        # consumer c0, window [10, 30] (20 s)
        _span("c0", "consumer", "startup", 5.0, 12.0),  # clipped to 10..12 -> 2 s busy
        _span("c0", "consumer", WAIT_FOR_DATA, 12.0, 15.0),
        _span("c0", "consumer", WAIT_FOR_DATA, 14.0, 16.0),  # overlaps: merged 12..16 = 4 s
        _span("c0", "consumer", TRAIN_STEP, 16.0, 20.0),
        _span("c0", "consumer", WAIT_FOR_WEIGHTS, 15.5, 16.0),  # inside the merged wait
        _span("c0", "consumer", WAIT_FOR_DATA, 28.0, 35.0),  # clipped: 28..30 = 2 s
        # background thread waiting/publishing: busy for that track, never idle of the worker
        _span("c0", "consumer", PUBLISH_WEIGHTS, 20.0, 23.0, thread="sender"),
        _span("c0", "consumer", WAIT_FOR_WEIGHTS, 20.0, 29.0, thread="sender"),
        # producer p0
        _span("p0", "producer", GENERATE, 10.0, 25.0),
        _span("p0", "producer", WAIT_FOR_WEIGHTS, 25.0, 30.0),
        # producer p1: no idle, entirely before the window except 1 s
        _span("p1", "producer", GENERATE, 0.0, 11.0),
    ]
    stats = worker_utilisation(spans, start=10.0, end=30.0)

    c0 = stats["c0"]
    assert c0.role == "consumer"
    assert c0.wall_s == 20.0
    assert c0.idle_s == pytest.approx(6.0)
    assert c0.idle_frac == pytest.approx(0.3)
    assert c0.busy_s == pytest.approx(
        {"startup": 2.0, TRAIN_STEP: 4.0, PUBLISH_WEIGHTS: 3.0, WAIT_FOR_WEIGHTS: 9.0}
    )
    assert c0.background_s == pytest.approx({PUBLISH_WEIGHTS: 3.0, WAIT_FOR_WEIGHTS: 9.0})
    # main track covers 10..20 and 28..30 -> 12 s of 20
    assert c0.untracked_s == pytest.approx(8.0)

    assert stats["p0"].idle_frac == pytest.approx(0.25)
    assert stats["p0"].busy_s == pytest.approx({GENERATE: 15.0})
    assert stats["p1"].idle_frac == 0.0
    assert stats["p1"].busy_s == pytest.approx({GENERATE: 1.0})

    assert role_idle_frac(stats, "producer") == pytest.approx(0.125)
    assert role_idle_frac(stats, "consumer") == pytest.approx(0.3)
    with pytest.raises(ValueError, match="roles present"):
        role_idle_frac(stats, "prodcer")
    with pytest.raises(ValueError, match="window"):
        worker_utilisation(spans, start=5.0, end=5.0)
    assert {WAIT_FOR_DATA, WAIT_FOR_WEIGHTS, RESTART} == IDLE_SPANS


def test_percentile_linear_interpolation():
    assert math.isnan(percentile([], 50))
    assert percentile([3.0], 90) == 3.0
    assert percentile([4, 1, 3, 2], 0) == 1.0
    assert percentile([4, 1, 3, 2], 100) == 4.0
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert percentile([10, 20, 30, 40, 50], 90) == pytest.approx(46.0)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


# ----------------------------------------------------------------------------------- metrics


def test_jsonl_sink_round_trip_writes_nan_as_null(tmp_path):
    sink = JsonlSink(tmp_path)
    assert isinstance(sink, MetricsSink)
    sink.log(0, {"reward": 0.5, "loss": float("nan"), "grad_norm": float("inf")})
    sink.log(1, {"reward": 0.75, "flag": True})
    sink.close()

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    raw = json.loads(lines[0])
    assert raw["loss"] is None and raw["grad_norm"] is None
    assert "NaN" not in lines[0] and "Infinity" not in lines[0]

    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["reward"] == 0.5
    assert math.isnan(rows[0]["loss"])
    assert rows[1] == {"step": 1, "time": rows[1]["time"], "reward": 0.75, "flag": 1.0}
    assert read_metrics(tmp_path / "nowhere") == []


def test_jsonl_sink_rejects_non_numbers_and_reserved_names(tmp_path):
    sink = JsonlSink(tmp_path)
    with pytest.raises(TypeError, match="'note'"):
        sink.log(0, {"note": "hello"})
    with pytest.raises(ValueError, match="reserved"):
        sink.log(0, {"step": 1.0})
    sink.close()


def test_multisink_fans_out_and_closes_all():
    class Recording:
        def __init__(self, fail_close=False):
            self.logged, self.closed, self.fail_close = [], False, fail_close

        def log(self, step, metrics):
            self.logged.append((step, dict(metrics)))

        def close(self):
            self.closed = True
            if self.fail_close:
                raise OSError("disk gone")

    a, b = Recording(fail_close=True), Recording()
    multi = MultiSink([a, b])
    multi.log(3, {"x": 1.0})
    assert a.logged == b.logged == [(3, {"x": 1.0})]
    with pytest.raises(OSError, match="disk gone"):
        multi.close()
    assert a.closed and b.closed


def test_optional_sinks_name_their_extra_when_missing():
    pytest.importorskip("torch")
    from zbrl.telemetry import TensorBoardSink, WandbSink

    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"pip install 'zbrl\[wandb\]'"):
            WandbSink("proj", "run")
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"pip install 'zbrl\[tensorboard\]'"):
            TensorBoardSink("/tmp/unused-tb")


# ------------------------------------------------------------------------------------ report


def _synthetic_run(run_dir: Path, with_metrics: bool) -> None:
    writer = TimelineWriter(run_dir)
    spans = []
    t = 1000.0
    for _ in range(5):
        spans.append(_span("consumer-0", "consumer", WAIT_FOR_DATA, t, t + 1.0))
        spans.append(_span("consumer-0", "consumer", TRAIN_STEP, t + 1.0, t + 3.0))
        spans.append(
            _span("consumer-0", "consumer", PUBLISH_WEIGHTS, t + 3.0, t + 3.5, thread="sender")
        )
        for p in range(2):
            spans.append(_span(f"producer-{p}", "producer", GENERATE, t + 0.1 * p, t + 2.6))
            spans.append(_span(f"producer-{p}", "producer", WAIT_FOR_WEIGHTS, t + 2.6, t + 3.0))
        t += 3.0
    writer.write(spans)
    if with_metrics:
        sink = JsonlSink(run_dir)
        for step in range(5):
            sink.log(step, {"reward": 0.1 * step, "ans_acc": 0.2 + 0.1 * step})
            if step % 2 == 0:
                sink.log(step, {"eval_accuracy": 0.25 + 0.1 * step})
        sink.close()
        (run_dir / "summary.json").write_text(json.dumps({"final_eval_accuracy": 0.65}))


@pytest.mark.parametrize("with_metrics", [True, False])
def test_render_report_writes_png_and_table(tmp_path, with_metrics):
    _synthetic_run(tmp_path, with_metrics)
    text = render_report(tmp_path)

    png = tmp_path / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    for worker in ("consumer-0", "producer-0", "producer-1"):
        assert worker in text
    # consumer: 5 s waiting in a 15.5 s window
    assert f"{100 * 5.0 / 15.5:.1f}" in text
    assert ("final_eval_accuracy: 0.65" in text) == with_metrics


def test_busy_idle_table_columns_and_values():
    spans = [
        _span("c0", "consumer", TRAIN_STEP, 0.0, 3.0),
        _span("c0", "consumer", WAIT_FOR_DATA, 3.0, 4.0),
        _span("c0", "consumer", PUBLISH_WEIGHTS, 3.0, 3.5, thread="sender"),
    ]
    table = busy_idle_table(worker_utilisation(spans, start=0.0, end=4.0))
    header, _, row, footnote = table.splitlines()
    assert header.split() == [
        "worker",
        "role",
        "wall",
        "s",
        "train_step",
        "publish_weights*",
        "idle",
        "s",
        "idle",
        "%",
    ]
    assert row.split() == ["c0", "consumer", "4.00", "3.00", "0.50", "1.00", "25.0"]
    assert "background" in footnote


def test_missing_or_empty_timeline_gives_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"timeline\.jsonl"):
        render_report(tmp_path)
    (tmp_path / "timeline.jsonl").write_text("")
    with pytest.raises(ValueError, match="no spans"):
        render_report(tmp_path)
