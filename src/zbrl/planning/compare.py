"""A prediction against a real run of the same shape (``bench/plan_validation.py``, its test).

The run's figures are taken over the same steady-state window as the prediction's (from the end of
the first tenth of the steps to the end of the last, :func:`zbrl.planning.rates.
steady_state_figures`); throughput is compared by relative error, idle shares by points.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from zbrl.planning.rates import METRICS_FILE, WARMUP_FRACTION, steady_state_figures
from zbrl.planning.simulate import Prediction
from zbrl.telemetry.timeline import read_timeline

THROUGHPUT_BOUND = 0.15
"""Largest relative error of the predicted trained samples/s (issue 12)."""
IDLE_BOUND = 0.05
"""Largest error of a predicted idle share, in points (0.05 = 5 points)."""
FIGURES = ("samples_per_s", "producer_idle_frac", "consumer_idle_frac", "mean_staleness")


def measured_figures(run_dir: str | Path, group_size: int) -> dict[str, float]:
    """A finished run's steady-state ``samples_per_s``, ``producer_idle_frac``,
    ``consumer_idle_frac`` (means over each role's workers) and ``mean_staleness`` (mean of the
    steps' ``staleness_mean`` inside the window)."""
    run_dir = Path(run_dir)
    steady = steady_state_figures(read_timeline(run_dir), group_size)
    if not steady:
        raise ValueError(f"{run_dir}: fewer than two training steps, no steady state to compare")
    stale = _steady_staleness(run_dir)
    return {
        "samples_per_s": steady["steady_samples_per_s"],
        "producer_idle_frac": steady["steady_producer_idle_frac"],
        "consumer_idle_frac": steady["steady_consumer_idle_frac"],
        "mean_staleness": stale,
    }


def _steady_staleness(run_dir: Path) -> float:
    by_step: dict[int, float] = {}
    for line in (run_dir / METRICS_FILE).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if isinstance(record, dict) and "staleness_mean" in record:
            by_step[int(record["step"])] = float(record["staleness_mean"])
    steps = sorted(by_step)
    if not steps:
        return float("nan")
    # metrics count steps from 1 (the version a step makes); the window's first step is the
    # (first + 1)-th span, i.e. metrics step first + 2
    first = max(0, min(len(steps) - 2, int(len(steps) * WARMUP_FRACTION)))
    return statistics.fmean(by_step[s] for s in steps[first + 1 :])


@dataclass(frozen=True)
class Comparison:
    """Predicted and measured figures of one shape, with their errors and the verdicts."""

    shape: str
    predicted: dict[str, float]
    measured: dict[str, float]

    @property
    def throughput_error(self) -> float:
        """(predicted − measured) / measured samples/s."""
        m = self.measured["samples_per_s"]
        return (self.predicted["samples_per_s"] - m) / m

    def idle_error(self, role: str) -> float:
        """Predicted − measured idle share of ``role`` (points as a fraction: 0.05 = 5 points)."""
        key = f"{role}_idle_frac"
        return self.predicted[key] - self.measured[key]

    @property
    def staleness_error(self) -> float:
        return self.predicted["mean_staleness"] - self.measured["mean_staleness"]

    @property
    def checks(self) -> dict[str, bool]:
        return {
            "samples_per_s": abs(self.throughput_error) <= THROUGHPUT_BOUND,
            "producer_idle_frac": abs(self.idle_error("producer")) <= IDLE_BOUND,
            "consumer_idle_frac": abs(self.idle_error("consumer")) <= IDLE_BOUND,
        }

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def as_dict(self) -> dict:
        return {
            "shape": self.shape,
            "predicted": self.predicted,
            "measured": self.measured,
            "throughput_error": self.throughput_error,
            "producer_idle_error": self.idle_error("producer"),
            "consumer_idle_error": self.idle_error("consumer"),
            "staleness_error": self.staleness_error,
            "checks": self.checks,
            "passed": self.passed,
        }


def predicted_figures(prediction: Prediction) -> dict[str, float]:
    return {key: float(getattr(prediction, key)) for key in FIGURES}


def median_comparison(shape: str, comparisons: list[Comparison]) -> Comparison:
    """Per figure, the median of the predictions and the median of the measurements."""
    if not comparisons:
        raise ValueError(f"no comparisons of shape {shape}")
    return Comparison(
        shape=shape,
        predicted={k: statistics.median(c.predicted[k] for c in comparisons) for k in FIGURES},
        measured={k: statistics.median(c.measured[k] for c in comparisons) for k in FIGURES},
    )


def median_pair_checks(comparisons: list[Comparison]) -> dict[str, bool]:
    """The bounds applied to the median over pairs of each pair's own error (throughput by
    relative error, idle shares in points). Each pair's prediction and run share one background
    load, so its error is a like-for-like figure; :func:`median_comparison` instead takes the
    median prediction and the median measurement separately, which can set one pair's prediction
    against another pair's run."""
    if not comparisons:
        raise ValueError("no comparisons")
    throughput = statistics.median(c.throughput_error for c in comparisons)
    producer = statistics.median(c.idle_error("producer") for c in comparisons)
    consumer = statistics.median(c.idle_error("consumer") for c in comparisons)
    return {
        "samples_per_s": abs(throughput) <= THROUGHPUT_BOUND,
        "producer_idle_frac": abs(producer) <= IDLE_BOUND,
        "consumer_idle_frac": abs(consumer) <= IDLE_BOUND,
    }


def render_table(comparisons: list[Comparison]) -> str:
    """One row per shape: predicted / measured figures, errors and PASS/FAIL."""
    header = (
        "shape",
        "samples/s pred",
        "meas",
        "err",
        "prod idle pred",
        "meas",
        "err pt",
        "cons idle pred",
        "meas",
        "err pt",
        "stale pred",
        "meas",
        "verdict",
    )
    rows = [header]
    for c in comparisons:
        p, m = c.predicted, c.measured
        failed = [k for k, ok in c.checks.items() if not ok]
        rows.append(
            (
                c.shape,
                f"{p['samples_per_s']:.1f}",
                f"{m['samples_per_s']:.1f}",
                f"{c.throughput_error:+.1%}",
                f"{p['producer_idle_frac']:.1%}",
                f"{m['producer_idle_frac']:.1%}",
                f"{c.idle_error('producer') * 100:+.1f}",
                f"{p['consumer_idle_frac']:.1%}",
                f"{m['consumer_idle_frac']:.1%}",
                f"{c.idle_error('consumer') * 100:+.1f}",
                f"{p['mean_staleness']:.2f}",
                f"{m['mean_staleness']:.2f}",
                "PASS" if not failed else "FAIL (" + ", ".join(_short(k) for k in failed) + ")",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(
        f"bounds: samples/s within {THROUGHPUT_BOUND:.0%} (relative), idle shares within "
        f"{IDLE_BOUND * 100:.0f} points; staleness is reported, not bounded"
    )
    return "\n".join(lines)


def _short(key: str) -> str:
    return {
        "samples_per_s": "throughput",
        "producer_idle_frac": "prod idle",
        "consumer_idle_frac": "cons idle",
    }[key]
