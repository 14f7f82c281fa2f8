"""The driver's view of a running job: drains the telemetry hub into the run's files, keeps the
progress bar, and computes live idle fractions.

Spans go to ``timeline.jsonl`` as they arrive; the driver keeps only the last
``LIVE_WINDOW_S`` seconds of them (for the progress bar's idle figures), so its memory does not
grow with the run. The end-of-run figures are computed from the file.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

from zbrl.config import RunConfig
from zbrl.launch.stop_grace import MeasuredTimes
from zbrl.telemetry.idle import role_idle_frac, worker_utilisation
from zbrl.telemetry.metrics import JsonlSink, MetricsSink, MultiSink
from zbrl.telemetry.overlap import Overlap, overlap
from zbrl.telemetry.spans import CHECKPOINT, TRAIN_STEP, Span, as_span
from zbrl.telemetry.timeline import TimelineWriter, read_timeline
from zbrl.transport.clients import HubClient

ROLLOUTS_FILE = "rollouts.jsonl"
IDLE_REFRESH_S = 5.0
LIVE_WINDOW_S = 120.0
"""The progress bar's idle figures cover the last this many seconds (spans older than that are
only on disk)."""


class RunMonitor:
    """Collects everything workers report and shows progress."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        hub: HubClient,
        total_steps: int,
        start_step: int = 0,
        sink: MetricsSink | None = None,
    ) -> None:
        """``start_step``: the step a resumed run continues from (its logs continue there).
        ``sink``: where metrics go, owned (closed) by the caller; None builds the configured
        sinks (:func:`local_sinks` and :func:`remote_sinks`), closed by :meth:`close`."""
        self.cfg = cfg
        self.run_dir = run_dir
        self.hub = hub
        self.timeline = TimelineWriter(run_dir)
        self._owns_sink = sink is None
        self.sink = sink or MultiSink([*local_sinks(cfg, run_dir), *remote_sinks(cfg)])
        self.recent: deque[Span] = deque()
        """Spans that ended within ``LIVE_WINDOW_S`` of the newest one."""
        self._newest_end = -math.inf
        self.step_metrics: dict[int, dict[str, float]] = {}
        self.eval_results: dict[int, dict[str, dict[str, float]]] = {}
        self.latest_step = start_step
        self.window_start: float | None = None
        self._bar = _progress_bar(cfg, total_steps, start_step)
        self._postfix: dict[str, str] = {}
        self._idle_refreshed_at = 0.0
        self._longest_s: dict[str, float] = {}
        """Longest ``train_step`` and ``checkpoint`` span so far (sizes the stop grace)."""

    def poll(self) -> None:
        """Drain the hub: append spans, log metrics, write rollouts, refresh the bar."""
        drained = self.hub.drain(timeout=60)
        if drained["spans"]:
            self.timeline.write(drained["spans"])
            spans = [as_span(s) for s in drained["spans"]]
            self._keep_recent(spans)
            self._keep_longest(spans)
        for step, metrics in drained["metrics"]:
            self.step_metrics[step] = metrics
            self.sink.log(step, _finite(metrics))
            self._advance(step, metrics)
        for kind, data in drained["events"]:
            if kind == "rollouts":
                with open(self.run_dir / ROLLOUTS_FILE, "a", encoding="utf-8") as f:
                    for rec in data:
                        f.write(json.dumps(rec) + "\n")
        self._refresh_idle()
        self._show()

    def record_eval(self, step: int, results: dict[str, dict[str, float]]) -> None:
        self.eval_results[step] = results
        flat: dict[str, float] = {}
        for name, metrics in results.items():
            for key, value in metrics.items():
                flat[f"eval/{name}/{key}"] = value
        first = next(iter(results.values()), {})
        if "accuracy" in first:
            flat["eval_accuracy"] = first["accuracy"]
            self._postfix["eval"] = f"{first['accuracy']:.2f}"
        self.sink.log(step, flat)
        self._show()

    def log_event(self, step: int, metrics: dict[str, float]) -> None:
        """Log driver-side metrics (for example ``producer_restarts``) at ``step``."""
        self.sink.log(step, metrics)

    def record_span(self, worker: str, role: str, name: str, start: float, end: float) -> None:
        """A span the driver observed for a worker (for example a producer's restart)."""
        span = Span(worker, role, name, start, end)
        self.timeline.write([span])
        self._keep_recent([span])

    def measured(self) -> MeasuredTimes:
        """The longest train step and checkpoint write seen so far (None: none yet)."""
        return MeasuredTimes(self._longest_s.get(TRAIN_STEP), self._longest_s.get(CHECKPOINT))

    def rewind(self, step: int) -> None:
        """The run continues from ``step`` again (the consumers were re-created from its
        checkpoint): forget the metrics of later steps and move the progress bar back."""
        self.step_metrics = {k: v for k, v in self.step_metrics.items() if k <= step}
        for sink in getattr(self.sink, "sinks", [self.sink]):
            if isinstance(sink, JsonlSink):
                sink.close()  # metrics.jsonl was cut back (a new file): append to that one
        if self._bar is not None and step < self.latest_step:
            self._bar.n = step
            self._bar.refresh()
        self.latest_step = step

    def run_figures(self, end: float) -> tuple[dict[str, float], Overlap | None]:
        """The idle fraction of each role over the whole run (from ``window_start`` to ``end``)
        and its overlap figures, from this segment's spans in ``timeline.jsonl``."""
        if self.window_start is None or end <= self.window_start:
            return {}, None
        spans = [s for s in read_timeline(self.run_dir) if s.end >= self.window_start]
        return _idle_by_role(spans, self.window_start, end), overlap(spans)

    def _keep_recent(self, spans: list[Span]) -> None:
        self.recent.extend(spans)
        self._newest_end = max([self._newest_end, *(s.end for s in spans)])
        while self.recent and self.recent[0].end < self._newest_end - LIVE_WINDOW_S:
            self.recent.popleft()

    def _keep_longest(self, spans: list[Span]) -> None:
        for s in spans:
            if s.name in (TRAIN_STEP, CHECKPOINT):
                self._longest_s[s.name] = max(self._longest_s.get(s.name, 0.0), s.duration)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._owns_sink:
            self.sink.close()

    def _advance(self, step: int, metrics: dict[str, float]) -> None:
        if self._bar is not None and step > self.latest_step:
            self._bar.update(step - self.latest_step)
        self.latest_step = max(self.latest_step, step)
        for key, label in (("reward", "reward"), ("ans_acc", "acc")):
            if key in metrics:
                self._postfix[label] = f"{metrics[key]:.2f}"

    def _refresh_idle(self) -> None:
        # the whole span history is scanned: do it every few seconds, not on every poll
        now = time.monotonic()
        if now - self._idle_refreshed_at < IDLE_REFRESH_S:
            return
        self._idle_refreshed_at = now
        if self.recent and self.window_start is not None:
            end = self._newest_end
            start = max(self.window_start, end - LIVE_WINDOW_S)
            if end > start:
                for role, frac in _idle_by_role(self.recent, start, end).items():
                    self._postfix[f"idle_{role[0]}"] = f"{frac:.0%}"

    def _show(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix(self._postfix, refresh=False)


def _idle_by_role(spans, start: float, end: float) -> dict[str, float]:
    stats = worker_utilisation(spans, start=start, end=end)
    out = {}
    for role in ("producer", "consumer"):
        try:
            out[role] = role_idle_frac(stats, role)
        except ValueError:
            continue
    return out


def local_sinks(cfg: RunConfig, run_dir: Path) -> list[MetricsSink]:
    """The sinks that write into the run directory: metrics.jsonl, and TensorBoard when
    ``logging.tensorboard``."""
    sinks: list[MetricsSink] = [JsonlSink(run_dir)]
    if cfg.logging.tensorboard:
        from zbrl.telemetry.metrics import TensorBoardSink

        sinks.append(TensorBoardSink(run_dir / "tb"))
    return sinks


def remote_sinks(cfg: RunConfig) -> list[MetricsSink]:
    """The sinks that need no run directory: Weights & Biases when ``logging.wandb``. The driver
    opens them before it claims the run directory, so a failed ``wandb.init`` claims nothing."""
    if not cfg.logging.wandb:
        return []
    from zbrl.telemetry.metrics import WandbSink

    return [WandbSink(cfg.logging.wandb_project, cfg.name, cfg.model_dump(mode="json"))]


def _progress_bar(cfg: RunConfig, total: int, initial: int):
    if not cfg.logging.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=f"zbrl {cfg.name}",
        unit="step",
        dynamic_ncols=True,
        mininterval=1.0,
    )


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool | int | float):
            out[k] = float(v) if math.isfinite(float(v)) else float("nan")
    return out
