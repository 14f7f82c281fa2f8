"""The run's summary.json figures: idle shares, overlap, staleness (per sample and per token),
weight sync, sample use, evaluations, and the start-up breakdown."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from zbrl.launch.startup import StartupClock, startup_line, startup_summary
from zbrl.telemetry.idle import percentile

if TYPE_CHECKING:
    from zbrl.launch.monitor import RunMonitor


def build_summary(
    monitor: RunMonitor,
    results: dict[str, Any],
    buffer_stats: dict[str, float],
    start: float,
    end: float,
    steps: int,
    initial: dict | None,
    final: dict | None,
) -> dict[str, Any]:
    idle, figures = monitor.run_figures(end)
    latencies = [
        lat
        for n, r in results.items()
        if n.startswith("producer")
        for lat in r.weight_sync_latencies_s
    ]
    staleness = [
        m["staleness_mean"] for m in monitor.step_metrics.values() if "staleness_mean" in m
    ]
    token_staleness = [m for m in monitor.step_metrics.values() if "token_staleness_mean" in m]
    return {
        "wall_s": end - start,
        "steps": steps,
        "eval_accuracy_initial": _primary_accuracy(initial),
        "eval_accuracy_final": _primary_accuracy(final),
        "producer_idle_frac": idle.get("producer"),
        "consumer_idle_frac": idle.get("consumer"),
        "mean_staleness": sum(staleness) / len(staleness) if staleness else 0.0,
        "mean_token_staleness": (
            sum(m["token_staleness_mean"] for m in token_staleness) / len(token_staleness)
            if token_staleness
            else 0.0
        ),
        "max_token_staleness": max(
            (m["token_staleness_max"] for m in token_staleness), default=0.0
        ),
        "overlap_efficiency": figures.overlap_efficiency if figures else None,
        "producer_generate_frac": figures.producer_generate_frac if figures else None,
        "overlap": figures.as_dict() if figures else None,
        "weight_sync_latency_p50_s": percentile(latencies, 50) if latencies else None,
        "weight_sync_latency_p95_s": percentile(latencies, 95) if latencies else None,
        "weight_sync_bytes_per_version": weight_sync_bytes(monitor),
        "samples_trained": int(buffer_stats["samples_trained"]),
        "samples_generated": int(buffer_stats["samples_generated"]),
        "sample_utilization": buffer_stats["sample_utilization"],
        "groups_filtered": int(
            buffer_stats["groups_filtered_accuracy"] + buffer_stats["groups_filtered_truncated"]
        ),
        "groups_failed_episodes": int(buffer_stats["groups_failed_episodes"]),
        "episodes_failed": int(buffer_stats["episodes_failed"]),
        "groups_dropped_stale": int(buffer_stats["groups_dropped_stale"]),
        "groups_dropped": groups_dropped(buffer_stats),
        "partial_batches": int(buffer_stats["partial_batches"]),
        "reward_failed_responses": int(buffer_stats["responses_reward_failed"]),
        "reward_failed_groups_dropped": int(buffer_stats["groups_dropped_reward_failed"]),
        "reward_failed_responses_trained": int(buffer_stats["responses_reward_failed_trained"]),
        "eval_initial": initial,
        "eval_final": final,
        "consumer_generation": consumer_generation_summary(monitor.step_metrics),
    }


def consumer_generation_summary(step_metrics: dict[int, dict[str, float]]) -> dict | None:
    """What idle consumers generated (``rollout.consumers_generate``; None when they could
    not): ``groups_generated`` (by rank 0), ``groups_trained`` (made by any consumer),
    ``steps_generating``, and ``planned_consumer_idle``: the online planner's predicted idle
    share of the mode each step ran in, averaged over the steps it predicted (to read beside
    the measured ``consumer_idle_frac``), with its last ``planned_*`` figures."""
    steps = [m for _, m in sorted(step_metrics.items()) if "consumer_generated_groups" in m]
    if not steps:
        return None
    planned = [
        m["planned_consumer_idle_on"]
        if m["consumer_generating"]
        else m["planned_consumer_idle_off"]
        for m in steps
        if "planned_consumer_idle_off" in m
        and (not m["consumer_generating"] or "planned_consumer_idle_on" in m)
    ]
    last = next((m for m in reversed(steps) if "planned_step_s_off" in m), {})
    return {
        "groups_generated": int(sum(m["consumer_generated_groups"] for m in steps)),
        "groups_trained": int(sum(m["consumer_trained_groups"] for m in steps)),
        "steps_generating": int(sum(m["consumer_generating"] for m in steps)),
        "planned_consumer_idle": sum(planned) / len(planned) if planned else None,
        **{k: v for k, v in last.items() if k.startswith("planned_")},
    }


# The buffer's reasons for dropping a group, each with its counter in BufferStats.
DROP_REASONS = {
    "reward_failed": "groups_dropped_reward_failed",
    "failed_episodes": "groups_failed_episodes",
    "accuracy_out_of_range": "groups_filtered_accuracy",
    "all_truncated": "groups_filtered_truncated",
    "stale": "groups_dropped_stale",
}


def groups_dropped(buffer_stats: dict[str, float]) -> dict[str, int]:
    """The groups the buffer dropped, by reason (every reason, 0 included)."""
    return {reason: int(buffer_stats[counter]) for reason, counter in DROP_REASONS.items()}


def add_startup(summary: dict[str, Any], clock: StartupClock, run_dir: Path) -> None:
    """The start-up breakdown into ``summary`` (``startup_s``, ``startup``, ``startup_workers``:
    :func:`zbrl.launch.startup.startup_summary`, from the run's spans), and as one log line."""
    from zbrl.telemetry.timeline import read_timeline

    try:
        spans = read_timeline(run_dir)
    except FileNotFoundError:
        spans = []
    summary.update(startup_summary(clock, spans))
    print(startup_line(summary), flush=True)


def weight_sync_bytes(monitor: RunMonitor) -> int | None:
    """Bytes of one published weight version (the median over this segment's publishes; with
    ``model.lora``, the adapters'), from the ``publish_weights`` spans; None before any."""
    from zbrl.telemetry.spans import PUBLISH_WEIGHTS
    from zbrl.telemetry.timeline import read_timeline

    try:
        spans = read_timeline(monitor.run_dir)
    except FileNotFoundError:
        return None
    since = monitor.window_start or 0.0
    sizes = [
        int(s.attrs["bytes"])
        for s in spans
        if s.name == PUBLISH_WEIGHTS and "bytes" in s.attrs and s.end >= since
    ]
    return int(percentile(sizes, 50)) if sizes else None


def _primary_accuracy(results: dict | None) -> float | None:
    if not results:
        return None
    return next(iter(results.values())).get("accuracy")
