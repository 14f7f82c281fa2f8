"""The measured rates of a finished run, read from its directory.

Inputs: ``RUN_DIR/timeline.jsonl`` (the spans), ``RUN_DIR/config.yaml`` (the resolved config: batch,
group size, workers of the run) and ``RUN_DIR/summary.json`` (the run's own idle shares and
weight-sync latencies, kept for comparison). ``RUN_DIR/metrics.jsonl`` is optional: its per-step
``response_length`` gives the response-length distribution.

Every rate is a median over the run's spans (robust to the slow first steps and to the odd
evaluation pause). With ``run_cores`` (the run's workers shared that many CPU cores), the work
spans become single-core work first: ``generate`` and ``train_step`` by the CPU time they recorded,
the others by processor sharing under the background load that CPU time reveals
(:mod:`zbrl.planning.contention`). Producers and consumers of the run are pooled: the rate of
"a producer" is the median over all producers' spans.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from zbrl.config import ConfigError, RunConfig, load_config
from zbrl.planning.contention import as_single_core, background_load
from zbrl.planning.memory import cp_size
from zbrl.telemetry.idle import worker_utilisation
from zbrl.telemetry.overlap import WARMUP_FRACTION, steady_window
from zbrl.telemetry.report import SUMMARY_FILE, read_summary
from zbrl.telemetry.spans import (
    CPU_S,
    GENERATE,
    LOAD_WEIGHTS,
    MAIN_THREAD,
    PUBLISH_WEIGHTS,
    PUSH,
    SCORE,
    TRAIN_STEP,
    WAIT_FOR_DATA,
    WAIT_FOR_WEIGHTS,
    Span,
)
from zbrl.telemetry.timeline import TIMELINE_FILE, read_timeline

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
WORK_SPANS = frozenset({GENERATE, SCORE, PUSH, LOAD_WEIGHTS, TRAIN_STEP})
"""Spans whose duration is CPU work (what ``run_cores`` converts)."""
CPU_TIMED = frozenset({GENERATE, TRAIN_STEP})
"""Work spans whose recorded CPU time (``cpu_s``) is their work: computed on the span's own
thread. Scoring and pushing are round trips to other processes (reward workers, the buffer):
their thread's CPU time misses their work, so they are converted by the sharing model."""


class RatesError(ValueError):
    """A run directory lacks what the planner needs (the message names the file)."""


@dataclass(frozen=True)
class GenerationModel:
    """Seconds of one ``generate`` call: ``intercept_s + per_response_s * responses``.

    Fitted by least squares when the run made generation calls of several sizes, else
    ``intercept_s`` is 0 and ``per_response_s`` the median of seconds per response."""

    intercept_s: float
    per_response_s: float
    sizes_seen: tuple[int, ...]
    """Distinct prompt counts of the run's generate calls."""

    def seconds(self, responses: int) -> float:
        return max(0.0, self.intercept_s + self.per_response_s * responses)


@dataclass(frozen=True)
class RunRates:
    """What the planner simulates with (seconds; medians over the run)."""

    run_dir: str
    group_size: int
    """Completions per prompt in the run (``rollout.generation.num_generations``)."""
    train_batch_size: int
    """Groups per training step in the run."""
    inference_batch_size: int
    inference_microbatch_size: int
    max_staleness: int
    buffer_capacity: int | None
    num_producers: int
    num_consumers: int
    max_steps: int
    run_cores: int | None
    """Cores the run's workers shared, when given: the busy rates below are then single-core
    work (None: taken as measured)."""
    background_load: float | None
    """With ``run_cores``: the other runnable processes the run's workers shared the cores with
    (Ray's, other users'), estimated from the spans' CPU times
    (:func:`zbrl.planning.contention.background_load`); None without CPU times or cores."""
    generation: GenerationModel
    score_per_response_s: float
    push_per_group_s: float
    load_weights_s: float
    """A producer swapping in a new version (its main thread, between batches)."""
    train_per_group_s: float
    generation_spread: tuple[float, ...]
    """Each generate span's duration over the model's prediction for it (its spread around the
    model; the simulation draws from it unless told to use the medians)."""
    score_spread: tuple[float, ...]
    """Each score span's seconds per response over ``score_per_response_s`` (scoring is a round
    trip to the reward workers: rare slow ones make a consumer wait)."""
    train_spread: tuple[float, ...]
    """Each train_step's seconds per group over ``train_per_group_s``."""
    """One training step of the run's consumers divided by the groups it trained."""
    take_latency_s: float
    """The consumer's round trip to take a batch that is already there: the lower quartile of
    its ``wait_for_data`` spans (idle time a consumer spends every step however fast the
    producers are). With ``run_cores`` it is work of the buffer's process, converted like the
    busy spans (the simulation slows it down when the cores are shared)."""
    step_overhead_s: float
    """Consumer main-thread time between a train_step's end and the next wait for data
    (gathering the state dict, staging the publish, bookkeeping)."""
    weight_sync_s: float
    """From a step's end until its weights can be loaded by a producer (see
    :func:`weight_sync_seconds`)."""
    weight_sync_source: str
    response_length_mean: float | None
    response_length_p10: float | None
    response_length_p90: float | None
    measured: dict[str, float]
    """The run's own summary figures (samples/s, idle shares, mean staleness)."""
    context_parallel_size: int = 1
    """Consumers of the run that split each sequence between them
    (``training.engine.context_parallel_size``): a data-parallel slice is this many consumers,
    and the run had ``num_consumers / context_parallel_size`` of them."""

    @property
    def data_parallel_size(self) -> int:
        """The run's data-parallel slices (its consumers over the context-parallel size)."""
        return self.num_consumers // self.context_parallel_size

    @property
    def generation_tokens_per_s(self) -> float | None:
        """Generated tokens per second of one producer's generate calls (needs lengths)."""
        if self.response_length_mean is None or self.generation.per_response_s <= 0:
            return None
        size = self.inference_microbatch_size * self.group_size
        return self.response_length_mean * size / self.generation.seconds(size)


def read_rates(run_dir: str | Path, run_cores: int | None = None) -> RunRates:
    """Read a finished run directory (see the module docstring); :class:`RatesError` names the
    missing or unusable file.

    ``run_cores``: the cores the run's workers shared. Given, the busy spans (generation, scoring,
    push, weight loading, training) are converted to single-core work first
    (:mod:`zbrl.planning.contention`); the gaps and waits stay wall time."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RatesError(f"run directory {run_dir} does not exist")
    cfg = _config(run_dir)
    summary = _summary(run_dir)
    try:
        spans = read_timeline(run_dir)
    except FileNotFoundError as e:
        raise RatesError(str(e)) from None
    timeline = run_dir / TIMELINE_FILE
    work = spans
    background = None
    if run_cores is not None:
        # a span's recorded CPU time is its single-core work when its worker ran one thread
        keep = CPU_TIMED if cfg.launch.torch_threads == 1 else frozenset()
        timed = _without_cpu_time(spans, keep)
        background = background_load(timed, run_cores, WORK_SPANS)
        work = as_single_core(timed, run_cores, WORK_SPANS | {WAIT_FOR_DATA}, background or 0.0)
    by_name: dict[str, list[Span]] = defaultdict(list)
    for s in work:
        by_name[s.name].append(s)
    for name in (GENERATE, TRAIN_STEP):
        if not by_name[name]:
            raise RatesError(f"{timeline} has no {name!r} spans: the run did not get that far")
    g = cfg.rollout.generation.num_generations
    lengths = _response_lengths(run_dir)
    sync_s, sync_source = weight_sync_seconds(spans)
    gen = generation_model(by_name[GENERATE], g, timeline)
    train_per_group = _per_unit(by_name[TRAIN_STEP], "groups", None, timeline)
    # the spread is the wall times' (relative to their own medians): on shared cores it holds the
    # load's ups and downs too, which make one side wait for the other however the means compare
    wall = [s for s in spans if s.name in (GENERATE, TRAIN_STEP)]
    return RunRates(
        run_dir=str(run_dir),
        group_size=g,
        train_batch_size=cfg.training.train_batch_size,
        inference_batch_size=cfg.rollout.inference_batch_size,
        inference_microbatch_size=cfg.rollout.inference_microbatch_size,
        max_staleness=cfg.transport.max_staleness,
        buffer_capacity=cfg.transport.buffer_capacity,
        num_producers=cfg.launch.num_producers,
        num_consumers=cfg.launch.num_consumers,
        max_steps=cfg.training.max_steps,
        run_cores=run_cores,
        background_load=background,
        generation=gen,
        score_per_response_s=_per_unit(by_name[SCORE], "responses", 0.0, timeline),
        push_per_group_s=_per_unit(by_name[PUSH], "groups", 0.0, timeline),
        load_weights_s=_median([s.duration for s in by_name[LOAD_WEIGHTS]], 0.0),
        train_per_group_s=train_per_group,
        generation_spread=generation_spread([s for s in wall if s.name == GENERATE], g, timeline),
        score_spread=_spread(by_name[SCORE], "responses", timeline),
        train_spread=train_spread([s for s in wall if s.name == TRAIN_STEP], timeline),
        take_latency_s=_quantile(
            [s.duration for s in by_name[WAIT_FOR_DATA] if s.role == "consumer"], 0.25
        )
        or 0.0,
        step_overhead_s=step_overhead_seconds(spans),
        weight_sync_s=sync_s,
        weight_sync_source=sync_source,
        response_length_mean=statistics.fmean(lengths) if lengths else None,
        response_length_p10=_quantile(lengths, 0.1),
        response_length_p90=_quantile(lengths, 0.9),
        measured={
            **_measured(summary),
            **steady_state_figures(spans, g),
            **_median_metric(run_dir, "train_tokens_per_s"),
        },
        context_parallel_size=cp_size(cfg),
    )


def generation_model(spans: list[Span], group_size: int, timeline: Path) -> GenerationModel:
    """Fit seconds per generate call against the responses it made (prompts × group size)."""
    points = [(_attr(s, "prompts", timeline) * group_size, s.duration) for s in spans]
    sizes = tuple(sorted({n // group_size for n, _ in points}))
    if len(sizes) >= 2:
        xs = [float(n) for n, _ in points]
        ys = [t for _, t in points]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        if slope > 0:
            return GenerationModel(my - slope * mx, slope, sizes)
    per = statistics.median(t / n for n, t in points if n > 0)
    return GenerationModel(0.0, per, sizes)


def generation_spread(spans: list[Span], group_size: int, timeline: Path) -> tuple[float, ...]:
    """Each generate span's duration over the prediction of a model fitted to these spans."""
    model = generation_model(spans, group_size, timeline)
    out = []
    for s in spans:
        expected = model.seconds(_attr(s, "prompts", timeline) * group_size)
        if expected > 0:
            out.append(s.duration / expected)
    return tuple(out)


def train_spread(spans: list[Span], timeline: Path) -> tuple[float, ...]:
    """Each train_step's seconds per group over their median."""
    return _spread(spans, "groups", timeline)


def _spread(spans: list[Span], key: str, timeline: Path) -> tuple[float, ...]:
    """Each span's seconds per ``key`` over their median (empty without spans)."""
    if not spans:
        return ()
    per_unit = _per_unit(spans, key, None, timeline)
    if per_unit <= 0:
        return ()
    return tuple(s.duration / _attr(s, key, timeline) / per_unit for s in spans)


def step_overhead_seconds(spans: list[Span]) -> float:
    """Median gap, per consumer main track, between a train_step's end and the next
    wait_for_data's start."""
    tracks: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        if (
            s.role == "consumer"
            and s.thread == MAIN_THREAD
            and s.name in (TRAIN_STEP, WAIT_FOR_DATA)
        ):
            tracks[s.worker].append(s)
    gaps = []
    for track in tracks.values():
        track.sort(key=lambda s: s.start)
        for a, b in itertools.pairwise(track):
            if a.name == TRAIN_STEP and b.name == WAIT_FOR_DATA:
                gaps.append(max(0.0, b.start - a.end))
    return _median(gaps, 0.0)


def weight_sync_seconds(spans: list[Span]) -> tuple[float, str]:
    """Seconds from the end of the step that made version ``v`` until a producer can load it.

    Measured directly where a producer waited for exactly that version (a ``wait_for_weights``
    span with ``reason=staleness, need=v`` that began before step ``v-1`` ended: its end minus that
    step's end). Otherwise the publish time plus the load time. The run summary's
    ``weight_sync_latency_*`` is not used: it runs until the producer next loads, which includes
    the generation batch it was in the middle of."""
    step_end: dict[int, float] = {}
    publish: list[float] = []
    loads: list[float] = []
    for s in spans:
        if s.name == TRAIN_STEP and "step" in s.attrs:
            step = int(s.attrs["step"])
            step_end[step] = max(step_end.get(step, 0.0), s.end)
        elif s.name == PUBLISH_WEIGHTS:
            publish.append(s.duration)
        elif s.name == LOAD_WEIGHTS:
            loads.append(s.duration)
    direct = []
    for s in spans:
        if s.name == WAIT_FOR_WEIGHTS and s.attrs.get("reason") == "staleness":
            end = step_end.get(int(s.attrs.get("need", 0)) - 1)
            if end is not None and s.start < end <= s.end:
                direct.append(s.end - end)
    if direct:
        return statistics.median(direct), f"measured at {len(direct)} staleness waits"
    if publish:
        return _median(publish, 0.0) + _median(loads, 0.0), "publish + load spans"
    return 0.0, "no weight-sync spans (taken as 0)"


def steady_state_figures(spans: list[Span], group_size: int) -> dict[str, float]:
    """The run's own figures over the window the simulation reports (from the end of the first
    tenth of the steps to the end of the last, :func:`zbrl.telemetry.overlap.steady_window`), to
    compare a prediction with like for like: ``steady_samples_per_s``,
    ``steady_producer_idle_frac``, ``steady_consumer_idle_frac`` (means over the workers of each
    role). Empty when the run made fewer than two steps."""
    window = steady_window(spans, WARMUP_FRACTION)
    if window is None:
        return {}
    start, end = window.start, window.end
    out = {"steady_samples_per_s": window.groups * group_size / (end - start)}
    stats = worker_utilisation(spans, start=start, end=end)
    for role in ("producer", "consumer"):
        fracs = [w.idle_frac for w in stats.values() if w.role == role]
        if fracs:
            out[f"steady_{role}_idle_frac"] = statistics.fmean(fracs)
    return out


# -- files ---------------------------------------------------------------------------------------


def _config(run_dir: Path) -> RunConfig:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise RatesError(f"no resolved config at {path}: is {run_dir} a zbrl run directory?")
    try:
        return load_config(path)
    except ConfigError as e:
        raise RatesError(f"{path} is not a valid zbrl config: {e}") from None


def _summary(run_dir: Path) -> dict:
    try:
        data = read_summary(run_dir)
    except ValueError as e:
        raise RatesError(str(e)) from None
    if data is None:
        raise RatesError(
            f"no {SUMMARY_FILE} at {run_dir / SUMMARY_FILE}: the run did not finish (plan needs "
            "a finished run)"
        )
    return data


def _response_lengths(run_dir: Path) -> list[float]:
    """Per-step mean response lengths from ``metrics.jsonl`` (empty when it is absent)."""
    return _metric(run_dir, "response_length")


def _metric(run_dir: Path, key: str) -> list[float]:
    """Every step's ``key`` in ``metrics.jsonl`` (empty when the file is absent)."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get(key), (int, float)):
            out.append(float(record[key]))
    return out


def _median_metric(run_dir: Path, key: str) -> dict[str, float]:
    values = _metric(run_dir, key)
    return {key: statistics.median(values)} if values else {}


def _measured(summary: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in ("producer_idle_frac", "consumer_idle_frac", "mean_staleness", "wall_s"):
        if isinstance(summary.get(key), (int, float)):
            out[key] = float(summary[key])
    if isinstance(summary.get("samples_trained"), (int, float)) and out.get("wall_s"):
        out["samples_per_s"] = float(summary["samples_trained"]) / out["wall_s"]
    return out


# -- small helpers -------------------------------------------------------------------------------


def _without_cpu_time(spans: list[Span], keep: frozenset[str]) -> list[Span]:
    """The spans without ``cpu_s`` except those named in ``keep`` (see :data:`CPU_TIMED`; a
    worker running several torch threads uses CPU time its span's thread does not see)."""
    return [
        replace(s, attrs={k: v for k, v in s.attrs.items() if k != CPU_S})
        if CPU_S in s.attrs and s.name not in keep
        else s
        for s in spans
    ]


def _attr(span: Span, key: str, timeline: Path) -> int:
    value = span.attrs.get(key)
    if not isinstance(value, (int, float)) or value <= 0:
        raise RatesError(
            f"{timeline}: a {span.name!r} span of {span.worker} lacks a positive {key!r} attribute"
        )
    return int(value)


def _per_unit(spans: list[Span], key: str, empty: float | None, timeline: Path) -> float:
    if not spans:
        if empty is None:
            raise RatesError(f"{timeline} has no spans to measure {key!r} from")
        return empty
    return statistics.median(s.duration / _attr(s, key, timeline) for s in spans)


def _median(values: list[float], empty: float) -> float:
    return statistics.median(values) if values else empty


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
