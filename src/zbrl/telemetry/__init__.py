"""Telemetry: timed spans, the run timeline, metrics sinks, busy/idle accounting and the report.

Workers record spans with a :class:`SpanRecorder`; the driver drains them into a
:class:`TimelineWriter`; :func:`worker_utilisation` turns the timeline into per-worker idle
fractions; :func:`render_report` writes ``report.png`` and returns a text table. No Ray here.
"""

from zbrl.telemetry.idle import (
    WorkerStats,
    covered_seconds,
    merge_intervals,
    percentile,
    role_idle_frac,
    span_window,
    worker_utilisation,
)
from zbrl.telemetry.metrics import (
    METRICS_FILE,
    JsonlSink,
    MetricsSink,
    MultiSink,
    TensorBoardSink,
    WandbSink,
    read_metrics,
)
from zbrl.telemetry.report import (
    REPORT_FILE,
    SUMMARY_FILE,
    busy_idle_table,
    plot_report,
    render_report,
)
from zbrl.telemetry.spans import (
    EVAL,
    GENERATE,
    IDLE_SPANS,
    LOAD_WEIGHTS,
    MAIN_THREAD,
    PUBLISH_WEIGHTS,
    PUSH,
    RESTART,
    SCORE,
    STARTUP,
    TRAIN_STEP,
    WAIT_FOR_DATA,
    WAIT_FOR_WEIGHTS,
    Span,
    SpanRecorder,
)
from zbrl.telemetry.timeline import (
    TIMELINE_FILE,
    TRACE_FILE,
    TimelineWriter,
    read_timeline,
    write_chrome_trace,
)

__all__ = [
    "EVAL",
    "GENERATE",
    "IDLE_SPANS",
    "LOAD_WEIGHTS",
    "MAIN_THREAD",
    "METRICS_FILE",
    "PUBLISH_WEIGHTS",
    "PUSH",
    "REPORT_FILE",
    "RESTART",
    "SCORE",
    "STARTUP",
    "SUMMARY_FILE",
    "TIMELINE_FILE",
    "TRACE_FILE",
    "TRAIN_STEP",
    "WAIT_FOR_DATA",
    "WAIT_FOR_WEIGHTS",
    "JsonlSink",
    "MetricsSink",
    "MultiSink",
    "Span",
    "SpanRecorder",
    "TensorBoardSink",
    "TimelineWriter",
    "WandbSink",
    "WorkerStats",
    "busy_idle_table",
    "covered_seconds",
    "merge_intervals",
    "percentile",
    "plot_report",
    "read_metrics",
    "read_timeline",
    "render_report",
    "role_idle_frac",
    "span_window",
    "worker_utilisation",
    "write_chrome_trace",
]
