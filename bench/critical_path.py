"""Where the time between two training steps goes, per policy version, from a run's spans.

At ``max_staleness: 1`` with one producer whose batch is one training step, the producer may start
batch ``b`` only after the consumer finished the step that made version ``b - 1`` (admission and
the staleness bound name the same version), and the consumer trains batch ``b`` right after step
``b - 1``. From the end of step ``v - 1`` (version ``v`` made) to the start of the step that
trains the batch generated with ``v``, the chain is: the reservation comes back to the producer
and version ``v`` reaches it (``reservation back``, ``weights loaded``), the producer generates,
scores and pushes (``generate``, ``score + push``), the groups reach the consumer (``groups to
consumer``). Both sides wait when that chain is longer than the consumer's own step in between
(docs/performance.md, "The demo at staleness 1").

Figures are milliseconds from the end of step ``v - 1`` unless the row says otherwise (rows with
a ``*`` only count versions where the receiving side was already waiting); medians, 90th
percentiles and means over the steady state (the steps after the first tenth, as
``zbrl.telemetry.overlap``)::

    python bench/critical_path.py RUN_DIR [RUN_DIR ...]

Reads ``RUN_DIR/timeline.jsonl`` and ``summary.json``; needs one producer and one consumer.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from zbrl.telemetry.idle import percentile
from zbrl.telemetry.overlap import WARMUP_FRACTION
from zbrl.telemetry.spans import (
    GENERATE,
    LOAD_WEIGHTS,
    PUBLISH_WEIGHTS,
    PUSH,
    TRAIN_STEP,
    WAIT_FOR_DATA,
    WAIT_FOR_WEIGHTS,
    Span,
)
from zbrl.telemetry.timeline import read_timeline

ROWS = (
    ("weights published", "end of the publish span (put and announcement sent)"),
    ("reservation back", "*the producer's reservation for its next batch returns"),
    ("weights loaded", "*version v loaded in the producer"),
    ("producer idle", "its waits (admission, staleness) before generating with v"),
    ("generate", "its generate span (a duration)"),
    ("score + push", "from the end of generate to the end of push (a duration)"),
    ("groups to consumer", "*from the end of push to the consumer's take returning"),
    ("consumer idle", "its wait_for_data before the step that trains those groups"),
)
"""Rows marked * count only the versions where the receiving side was already waiting (so the
figure is the hand-off's latency, not the receiver's own work)."""


def breakdown(spans: list[Span]) -> dict[str, list[float]]:
    """Per row of :data:`ROWS`, one value (seconds) per steady-state version."""
    by: dict[tuple[str, str], list[Span]] = defaultdict(list)
    for s in spans:
        by[(s.role, s.name)].append(s)
    for group in by.values():
        group.sort(key=lambda s: s.start)
    step_end = {int(s.attrs["step"]): s.end for s in by[("consumer", TRAIN_STEP)]}
    taken = {int(s.attrs["step"]): s for s in by[("consumer", WAIT_FOR_DATA)]}
    published = {int(s.attrs["version"]): s for s in by[("consumer", PUBLISH_WEIGHTS)]}
    loaded = {int(s.attrs["version"]): s for s in by[("producer", LOAD_WEIGHTS)]}
    waits = by[("producer", WAIT_FOR_WEIGHTS)]
    pushes = by[("producer", PUSH)]
    out: dict[str, list[float]] = defaultdict(list)
    steps = sorted(step_end)
    for v in steps[int(len(steps) * WARMUP_FRACTION) + 1 : -1]:
        t0 = step_end.get(v - 1)
        gens = by[("producer", GENERATE)]
        gen = next((s for s in gens if s.attrs.get("version") == v), None)
        if t0 is None or gen is None or v not in loaded:
            continue
        prev_end = max((s.end for s in gens if s.end <= gen.start), default=t0 - 1.0)
        before = [s for s in waits if s.start >= prev_end and s.end <= gen.start]  # this batch's
        admission = [s for s in before if s.attrs.get("reason") == "admission"]
        if v in published:
            out["weights published"].append(published[v].end - t0)
        if admission and admission[-1].start <= t0 < admission[-1].end:
            out["reservation back"].append(admission[-1].end - t0)
        if before and min(s.start for s in before) <= t0:
            out["weights loaded"].append(loaded[v].end - t0)
        out["producer idle"].append(sum(s.duration for s in before))
        out["generate"].append(gen.duration)
        push = next((s for s in pushes if s.start >= gen.end), None)
        if push is None:
            continue
        out["score + push"].append(push.end - gen.end)
        take = taken.get(v + 1)  # the groups generated with v are trained at step v + 1
        if take is None or take.end < push.end:
            continue
        if take.start <= push.end:
            out["groups to consumer"].append(take.end - push.end)
        out["consumer idle"].append(take.duration)
    return out


def print_table(run_dir: Path) -> None:
    rows = breakdown(read_timeline(run_dir))
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    print(f"\n{run_dir}")
    if "overlap_efficiency" in summary:
        print(
            f"overlap_efficiency {summary['overlap_efficiency']:.3f}  producer idle "
            f"{summary['producer_idle_frac']:.1%}  consumer idle "
            f"{summary['consumer_idle_frac']:.1%}"
        )
    print(f"{'ms':<24} {'p50':>7} {'p90':>7} {'mean':>7}    n  from the end of step v-1 to")
    for name, what in ROWS:
        xs = rows.get(name, [])
        if not xs:
            continue
        print(
            f"{name:<24} {1e3 * statistics.median(xs):7.1f} {1e3 * percentile(xs, 90):7.1f} "
            f"{1e3 * statistics.fmean(xs):7.1f} {len(xs):4d}  {what}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    for run_dir in parser.parse_args(argv).run_dirs:
        print_table(run_dir)


if __name__ == "__main__":
    main()
