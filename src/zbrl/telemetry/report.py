"""The run report: a busy/idle table (text) and ``report.png`` (learning curves + worker timeline).

Reads what a run directory holds: ``timeline.jsonl`` (required), ``metrics.jsonl`` and
``summary.json`` (optional). Plots with matplotlib's Agg canvas directly (no pyplot, so no global
backend state is touched and no display is needed).
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zbrl.telemetry import spans as S
from zbrl.telemetry.idle import WorkerStats, role_idle_frac, span_window, worker_utilisation
from zbrl.telemetry.metrics import read_metrics
from zbrl.telemetry.spans import MAIN_THREAD, Span
from zbrl.telemetry.timeline import (
    TIMELINE_FILE,
    TRACE_FILE,
    read_timeline,
    track_order,
    write_chrome_trace,
)

REPORT_FILE = "report.png"
SUMMARY_FILE = "summary.json"

SPAN_ORDER = (
    S.STARTUP,
    S.GENERATE,
    S.SCORE,
    S.PUSH,
    S.LOAD_WEIGHTS,
    S.TRAIN_STEP,
    S.PUBLISH_WEIGHTS,
    S.EVAL,
    S.WAIT_FOR_DATA,
    S.WAIT_FOR_WEIGHTS,
)
SPAN_COLORS = {
    S.STARTUP: "#9e9e9e",
    S.GENERATE: "#1f77b4",
    S.SCORE: "#ff7f0e",
    S.PUSH: "#17becf",
    S.LOAD_WEIGHTS: "#9467bd",
    S.TRAIN_STEP: "#2ca02c",
    S.PUBLISH_WEIGHTS: "#8c564b",
    S.EVAL: "#e377c2",
}
_EXTRA_COLORS = ("#bcbd22", "#7f7f7f", "#aec7e8", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2")
IDLE_FACE, IDLE_EDGE = "#e6e6e6", "#d62728"

# metrics.jsonl key -> (panel, label)
CURVES = {
    "reward": ("reward", "train reward"),
    "ans_acc": ("accuracy", "train answer accuracy"),
    "eval_accuracy": ("accuracy", "held-out accuracy"),
}


def _name_order(names: set[str]) -> list[str]:
    known = [n for n in SPAN_ORDER if n in names]
    return known + sorted(names - set(known))


def busy_idle_table(stats: Mapping[str, WorkerStats]) -> str:
    """Fixed-width table: worker, role, wall s, busy s per span name, idle s, idle %.

    A ``*`` after a span name marks time recorded on a background thread track (busy, never idle).
    """
    names = _name_order({n for st in stats.values() for n in st.busy_s})
    background = {n for st in stats.values() for n in st.background_s}
    headers = ["worker", "role", "wall s"]
    headers += [n + ("*" if n in background else "") for n in names]
    headers += ["idle s", "idle %"]
    rows = []
    for worker in sorted(stats, key=lambda w: (stats[w].role, w)):
        st = stats[worker]
        row = [worker, st.role, f"{st.wall_s:.2f}"]
        row += [f"{st.busy_s[n]:.2f}" if n in st.busy_s else "-" for n in names]
        row += [f"{st.idle_s:.2f}", f"{100 * st.idle_frac:.1f}"]
        rows.append(row)
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def fmt(cells: list[str]) -> str:
        left = [c.ljust(w) for c, w in zip(cells[:2], widths[:2], strict=True)]
        right = [c.rjust(w) for c, w in zip(cells[2:], widths[2:], strict=True)]
        return "  ".join(left + right).rstrip()

    lines = [fmt(headers), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]
    if background:
        lines.append("* on a background thread: counted as busy, never as idle")
    return "\n".join(lines)


def _load_spans(run_dir: Path) -> list[Span]:
    spans = read_timeline(run_dir)
    if not spans:
        raise ValueError(f"{run_dir / TIMELINE_FILE} holds no spans: nothing to report")
    return spans


def _busy_idle(spans: list[Span]) -> tuple[dict[str, WorkerStats], float, float]:
    """Each worker's busy/idle figures and the window they cover: from the first span to the last,
    leaving out the workers' ``startup`` spans (the summary's ``startup_s`` and ``startup``
    account for start-up), so that the idle shares are those of the run, as before workers
    recorded them."""
    working = [s for s in spans if s.name != S.STARTUP] or spans
    start, end = span_window(working)
    return worker_utilisation(working, start=start, end=end), start, end


def plot_report(run_dir: str | os.PathLike[str]) -> Path:
    """Write ``RUN_DIR/report.png`` and return its path."""
    run_dir = Path(run_dir)
    spans = _load_spans(run_dir)
    stats, _, _ = _busy_idle(spans)
    return _plot(spans, read_metrics(run_dir), stats, run_dir / REPORT_FILE)


def render_report(run_dir: str | os.PathLike[str]) -> str:
    """Analyse a run directory: returns the report text (busy/idle table, idle fraction per
    role, ``summary.json`` entries) and writes ``report.png`` and ``trace.json`` next to it."""
    run_dir = Path(run_dir)
    spans = _load_spans(run_dir)
    stats, start, end = _busy_idle(spans)
    png = _plot(spans, read_metrics(run_dir), stats, run_dir / REPORT_FILE)
    trace = write_chrome_trace(spans, run_dir / TRACE_FILE)

    roles = sorted({st.role for st in stats.values()})
    role_line = ", ".join(f"{r} {100 * role_idle_frac(stats, r):.1f}%" for r in roles)
    lines = [
        f"zbrl run report: {run_dir}",
        f"window: {end - start:.2f} s, {len(spans)} spans, {len(stats)} workers",
        "",
        busy_idle_table(stats),
        "",
        f"mean idle fraction by role: {role_line}",
    ]
    summary = read_summary(run_dir) or {}
    if summary:
        lines += ["", f"{SUMMARY_FILE}:"]
        lines += [f"  {k}: {v}" for k, v in _flatten(summary)]
    lines += ["", f"wrote {png}", f"wrote {trace} (open in https://ui.perfetto.dev)"]
    return "\n".join(lines)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """``RUN_DIR/summary.json``; None when the run wrote none (it has not finished). A ValueError
    naming the file when it is not a JSON object."""
    path = run_dir / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object (it holds a {type(data).__name__})")
    return data


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out += _flatten(v, key + ".")
        elif isinstance(v, float):
            out.append((key, f"{v:.6g}"))
        else:
            text = json.dumps(v) if isinstance(v, list | tuple) else str(v)
            out.append((key, text if len(text) <= 100 else text[:97] + "..."))
    return out


# ----------------------------------------------------------------------------------- plotting


def _curves(rows: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    found: dict[str, tuple[list[int], list[float]]] = {}
    for key in CURVES:
        pts = [(r["step"], r[key]) for r in rows if key in r and math.isfinite(r[key])]
        if pts:
            found[key] = ([p[0] for p in pts], [p[1] for p in pts])
    return found


def _plot(
    spans: list[Span],
    metrics: list[dict[str, Any]],
    stats: Mapping[str, WorkerStats],
    path: Path,
) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curves = _curves(metrics)
    threads: dict[str, set[str]] = defaultdict(set)
    for s in spans:
        threads[s.worker].add(s.thread)
    workers = sorted(stats, key=lambda w: (stats[w].role, w))
    tracks = [(w, t) for w in workers for t in track_order(threads[w])]
    timeline_h = max(2.0, 0.45 * len(tracks) + 1.2)
    fig = Figure(figsize=(13, timeline_h + (3.2 if curves else 0.0)), layout="constrained")
    FigureCanvasAgg(fig)
    if curves:
        gs = fig.add_gridspec(2, 2, height_ratios=[3.2, timeline_h])
        _plot_curves(fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[0, 1]), curves)
        ax_t = fig.add_subplot(gs[1, :])
    else:
        ax_t = fig.add_subplot(1, 1, 1)
    _plot_timeline(ax_t, spans, tracks, stats)
    fig.savefig(path, dpi=110)
    return path


def _plot_curves(ax_r: Any, ax_a: Any, curves: dict[str, tuple[list[int], list[float]]]) -> None:
    for ax, panel, ylabel in ((ax_r, "reward", "reward"), (ax_a, "accuracy", "accuracy")):
        keys = [k for k in curves if CURVES[k][0] == panel]
        for k in keys:
            steps, ys = curves[k]
            ax.plot(steps, ys, marker="o" if len(steps) <= 50 else None, ms=3, label=CURVES[k][1])
        if keys:
            ax.legend(loc="best", fontsize=8)
        else:
            ax.text(
                0.5,
                0.5,
                f"no {panel} in metrics",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="grey",
            )
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} vs step", fontsize=10)
        ax.grid(alpha=0.3)


def _plot_timeline(
    ax: Any, spans: list[Span], tracks: list[tuple[str, str]], stats: Mapping[str, WorkerStats]
) -> None:
    from matplotlib.patches import Patch

    t0 = min(s.start for s in spans)
    row = {track: i for i, track in enumerate(tracks)}
    bars: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    durations: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        if (s.worker, s.thread) not in row:  # a worker that only started (no stats): not drawn
            continue
        key = "idle" if s.is_idle else s.name
        bars[(s.worker, s.thread)][key].append((s.start - t0, s.duration))
        durations[key].append(s.duration)

    names = _name_order({n for n in durations if n != "idle"})
    extra = iter(_EXTRA_COLORS * (1 + len(names) // len(_EXTRA_COLORS)))
    colors = {n: SPAN_COLORS.get(n) or next(extra) for n in names}
    # Long spans first so shorter (nested) ones are drawn on top of them.
    draw_order = sorted(durations, key=lambda n: -sum(durations[n]) / len(durations[n]))
    for track, by_name in bars.items():
        y = row[track]
        for key in draw_order:
            if key not in by_name:
                continue
            if key == "idle":
                style = {"facecolor": IDLE_FACE, "edgecolor": IDLE_EDGE, "hatch": "////"}
            else:
                style = {"facecolor": colors[key], "edgecolor": "none"}
            ax.broken_barh(by_name[key], (y - 0.38, 0.76), linewidth=0.4, **style)

    labels = [w if t == MAIN_THREAD else f"{w} [{t}]" for w, t in tracks]
    ax.set_yticks(range(len(tracks)), labels, fontsize=8)
    ax.set_ylim(len(tracks) - 0.5, -0.5)
    ax.set_xlim(0, max(s.end for s in spans) - t0)
    ax.set_xlabel("seconds since first span")
    ax.grid(axis="x", alpha=0.3)
    for (w, t), y in row.items():
        if t == MAIN_THREAD and w in stats:
            ax.text(
                1.005,
                y,
                f"idle {100 * stats[w].idle_frac:.0f}%",
                va="center",
                fontsize=8,
                transform=ax.get_yaxis_transform(),
                color=IDLE_EDGE,
            )
    roles = sorted({st.role for st in stats.values()})
    idle_by_role = ", ".join(f"{r} {100 * role_idle_frac(stats, r):.1f}%" for r in roles)
    ax.set_title(f"worker timeline — mean idle: {idle_by_role}", fontsize=10)

    handles = [Patch(facecolor=colors[n], label=n) for n in names]
    if "idle" in durations:
        handles.append(
            Patch(
                facecolor=IDLE_FACE,
                edgecolor=IDLE_EDGE,
                hatch="////",
                label="idle (" + " / ".join(sorted(S.IDLE_SPANS)) + ")",
            )
        )
    ax.figure.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), 6),
        fontsize=8,
        frameon=False,
    )
