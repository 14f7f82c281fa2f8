"""A discrete-event simulation of a run's producers, consumers and rollout buffer.

The admission rule is not re-implemented: the simulation drives the run's own
:class:`zbrl.transport.buffer.RolloutBuffer` from a single-threaded event loop (every ``reserve``
and ``take`` with ``timeout=0``), so ticket order, the staleness bound and the dropping of stale
groups are the code the real run executes. Time is simulated; durations come from
:class:`zbrl.planning.rates.RunRates`.

Model (see docs/planning.md):

- a **producer** loops: reserve up to ``inference_batch_size`` tickets (idle while admission
  refuses) → wait until a weights version ``>= min_version`` is available (idle) → load the newest
  available version if it is newer than its own (``load_weights_s``) → per micro-batch of
  prompts, generate (the fitted generation model × ``gen_scale``) and score → push (per group);
  the groups carry the version it loaded;
- the **consumers** (``M`` ranks in lockstep, one simulated entity; ``M / C`` data-parallel
  slices of the run's context-parallel size ``C``, see :func:`step_seconds`) loop: take
  ``train_batch_size`` groups (idle while they are not ready, then for the take's round trip
  ``take_latency_s``, the buffer's work) → train one step → the step's
  bookkeeping (``step_overhead_s``) → ``advance_version``. The step's weights become available
  to producers ``weight_sync_s`` after the step ends;
- **cores** (optional): fair sharing (:func:`zbrl.planning.contention.fair_shares`). Every busy
  producer is one thread, a busy consumer step ``M`` (its ranks), the step's bookkeeping and a
  take one; waiting needs no core; a background load ``E`` of other processes is ``E`` threads.
  While they do not fit on the ``C`` cores, each competitor gets an equal share, at most its
  threads; the ``M`` lockstep ranks of a step compete as one (a rank at the all-reduce sleeps
  and hands its core over) and advance at their share ÷ ``M``. With single threads this is plain
  processor sharing, ``C / (D + E)`` each. Without ``cores`` every worker has its own (e.g. one
  GPU each).

Figures are taken in steady state: over the window from the end of the first tenth of the steps
to the end of the last one.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from zbrl.planning.contention import fair_shares
from zbrl.planning.rates import WARMUP_FRACTION, RunRates
from zbrl.transport.buffer import BufferSettings, RolloutBuffer
from zbrl.types import RolloutGroup

_EPS = 1e-12


@dataclass(frozen=True)
class Shape:
    """The run to predict (the CLI fills every field; unset ones come from the measured run)."""

    producers: int
    consumers: int
    max_staleness: int
    train_batch_size: int
    """Groups per training step."""
    group_size: int
    inference_batch_size: int
    """Groups a producer reserves at most per generation batch."""
    inference_microbatch_size: int
    """Prompts per generate call."""
    buffer_capacity: int | None
    gen_scale: float
    """Multiplies the generation time (another model size or hardware)."""
    train_scale: float
    """Multiplies the training-step time."""
    cores: int | None
    """Cores the workers share (None: each worker has its own device)."""
    background_load: float
    """Other runnable processes sharing those cores (0: the machine is the run's alone); only
    with ``cores``."""
    dp_efficiency: float
    """Parallel efficiency of data-parallel consumers (see :func:`step_seconds`)."""
    steps: int
    seed: int | None
    """Draw each generation batch's and step's time from the run's spread around the medians,
    with this seed (None: every batch and step takes the median time)."""


def measured_shape(
    rates: RunRates,
    *,
    producers: int,
    consumers: int,
    cores: int | None,
    dp_efficiency: float,
    steps: int,
    seed: int | None,
) -> Shape:
    """The measured run's own settings and background load (scales 1) with ``producers`` ×
    ``consumers``: the shape to compare a real run of that shape with."""
    return Shape(
        producers=producers,
        consumers=consumers,
        max_staleness=rates.max_staleness,
        train_batch_size=rates.train_batch_size,
        group_size=rates.group_size,
        inference_batch_size=rates.inference_batch_size,
        inference_microbatch_size=rates.inference_microbatch_size,
        buffer_capacity=rates.buffer_capacity,
        gen_scale=1.0,
        train_scale=1.0,
        cores=cores,
        background_load=rates.background_load or 0.0,
        dp_efficiency=dp_efficiency,
        steps=steps,
        seed=seed,
    )


@dataclass
class Prediction:
    """The simulated run's steady-state figures."""

    shape: Shape
    samples_per_s: float
    steps_per_s: float
    producer_idle_frac: float
    """Mean over producers of the share of the window spent waiting."""
    consumer_idle_frac: float
    mean_staleness: float
    """Over the groups of the steps inside the steady-state window."""
    max_staleness: int
    """Largest staleness of any trained group (never above ``shape.max_staleness``)."""
    step_s: float
    """Seconds of one consumer step (all ranks together, without core sharing)."""
    producer_batch_s: float
    """Seconds of one full producer batch (generate + score + push, without core sharing)."""
    groups_dropped_stale: int
    staleness_trace: list[int] = field(repr=False, default_factory=list)
    """Staleness of every trained group, in training order."""

    def as_dict(self) -> dict[str, float | int | None]:
        s = self.shape
        return {
            "producers": s.producers,
            "consumers": s.consumers,
            "max_staleness": s.max_staleness,
            "train_batch_size": s.train_batch_size,
            "group_size": s.group_size,
            "cores": s.cores,
            "background_load": s.background_load,
            "samples_per_s": self.samples_per_s,
            "steps_per_s": self.steps_per_s,
            "producer_idle_frac": self.producer_idle_frac,
            "consumer_idle_frac": self.consumer_idle_frac,
            "mean_staleness": self.mean_staleness,
            "max_staleness_seen": self.max_staleness,
            "step_s": self.step_s,
            "producer_batch_s": self.producer_batch_s,
            "groups_dropped_stale": self.groups_dropped_stale,
        }


def step_seconds(rates: RunRates, shape: Shape) -> float:
    """One training step of ``shape.consumers`` consumers.

    The unit of data parallelism is a slice of C consumers, C the run's context-parallel size
    (``training.engine.context_parallel_size``; 1 without it): the C ranks of a slice split each
    sequence between them, so a slice's speed is what the run measured, and the consumers form
    ``D = M / C`` data-parallel slices. The run's measured step, per group, is first turned into
    one slice's work (× the run's slices × their efficiency), scaled to the new batch (groups ×
    group size, linear) and ``train_scale``, then split over the new slices at ``dp_efficiency``
    (1 for a single slice): ``t_D = t_1 / (D · e)``. When the shape has the run's consumers and
    batch this is the measured step itself."""

    def eff(d: int) -> float:
        return 1.0 if d == 1 else shape.dp_efficiency

    run_slices = rates.data_parallel_size
    one_slice_per_group = rates.train_per_group_s * run_slices * eff(run_slices)
    per_group = one_slice_per_group * shape.group_size / rates.group_size
    work = per_group * shape.train_batch_size * shape.train_scale
    slices = shape.consumers // rates.context_parallel_size
    return work / (slices * eff(slices))


def producer_batch_seconds(rates: RunRates, shape: Shape, groups: int) -> float:
    """Generate, score and push ``groups`` prompts (without loading weights)."""
    return sum(producer_batch_parts(rates, shape, groups))


def producer_batch_parts(rates: RunRates, shape: Shape, groups: int) -> tuple[float, float, float]:
    """Seconds generating, scoring and pushing ``groups`` prompts."""
    generate = score = 0.0
    left = groups
    while left > 0:
        chunk = min(left, shape.inference_microbatch_size)
        responses = chunk * shape.group_size
        generate += rates.generation.seconds(responses) * shape.gen_scale
        score += rates.score_per_response_s * responses
        left -= chunk
    return generate, score, rates.push_per_group_s * groups


@dataclass
class _Activity:
    work_s: float
    cores: int
    owner: str
    started: float
    on_done: Callable[[float], None]


class _Simulation:
    def __init__(self, rates: RunRates, shape: Shape) -> None:
        self.rates, self.shape = rates, shape
        self.buffer = RolloutBuffer(
            BufferSettings(
                groups_per_step=shape.train_batch_size,
                max_staleness=shape.max_staleness,
                num_producers=shape.producers,
                filter_range=None,
                dynamic_batching=False,
                drop_all_truncated_groups=False,
                capacity=shape.buffer_capacity,
            )
        )
        self.now = 0.0
        self.available = 0  # newest weights version producers can load
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.activities: list[_Activity] = []
        self.busy: dict[str, list[tuple[float, float]]] = {}
        self.loaded = [0] * shape.producers
        self.reservations: list = [None] * shape.producers
        self.producer_busy = [False] * shape.producers
        self.consumer_busy = False
        self.version = 0
        self.step_ends: list[float] = []
        self.samples_per_step: list[int] = []
        self.staleness: list[list[int]] = []  # per step, its groups' staleness
        self.step_s = step_seconds(rates, shape)
        self._rng = random.Random(shape.seed) if shape.seed is not None else None
        length = max(1, round(rates.response_length_mean or 1))
        self._response = torch.zeros(length, dtype=torch.long)
        self._logprobs = torch.zeros(length)

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        while self.version < self.shape.steps:
            self._kick()
            speeds = self._speeds()
            dt = math.inf
            if self.activities:
                dt = min(a.work_s / v for a, v in zip(self.activities, speeds))
            if self.events:
                dt = min(dt, self.events[0][0] - self.now)
            if math.isinf(dt):
                raise RuntimeError(
                    f"simulation stalled at t={self.now:.3f}s, version {self.version}: "
                    "no worker can move (check the shape's batch and staleness)"
                )
            dt = max(0.0, dt)
            self.now += dt
            done = []
            for a, v in zip(self.activities, speeds):
                a.work_s -= dt * v
                if a.work_s <= _EPS:
                    done.append(a)
            for a in done:
                self.activities.remove(a)
                self.busy.setdefault(a.owner, []).append((a.started, self.now))
                a.on_done(self.now)
            while self.events and self.events[0][0] <= self.now + _EPS:
                heapq.heappop(self.events)[2]()

    def _speeds(self) -> list[float]:
        """Each activity's speed (a fraction of its measured one) under the cores' sharing."""
        if self.shape.cores is None:
            return [1.0] * len(self.activities)
        threads = [a.cores for a in self.activities]
        shares = fair_shares(threads, self.shape.cores, self.shape.background_load)
        return [share / t for share, t in zip(shares, threads)]

    def _at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, fn))

    def _start(
        self, owner: str, work_s: float, cores: int, on_done: Callable[[float], None]
    ) -> None:
        if work_s <= _EPS:  # zero-length work: done at once (no busy time)
            on_done(self.now)
            return
        self.activities.append(_Activity(work_s, cores, owner, self.now, on_done))

    def _draw(self, spread: tuple[float, ...]) -> float:
        """A factor on the median time: 1, or one drawn from the run's spread."""
        if self._rng is None or not spread:
            return 1.0
        return self._rng.choice(spread)

    def _kick(self) -> None:
        """Start everything that can start now (admissions, loads, takes), until nothing moves."""
        moved = True
        while moved:
            moved = False
            for p in range(self.shape.producers):
                moved |= self._try_producer(p)
            moved |= self._try_consumer()

    # -- producers -------------------------------------------------------------------------------

    def _try_producer(self, p: int) -> bool:
        if self.producer_busy[p]:
            return False
        if self.reservations[p] is None:
            res = self.buffer.reserve(p, self.shape.inference_batch_size, timeout=0)
            if res is None or not res.tickets:
                return False
            self.reservations[p] = res
        res = self.reservations[p]
        if self.available < res.min_version:
            return False
        version = self.available
        generate, score, push = producer_batch_parts(self.rates, self.shape, len(res.tickets))
        work = generate * self._draw(self.rates.generation_spread)
        work += score * self._draw(self.rates.score_spread) + push
        if version > self.loaded[p]:
            work += self.rates.load_weights_s
            self.loaded[p] = version
        self.producer_busy[p] = True
        self._start(f"producer-{p}", work, 1, lambda _t: self._push(p, version))
        return True

    def _push(self, p: int, version: int) -> None:
        res = self.reservations[p]
        g = self.shape.group_size
        groups = [
            RolloutGroup(
                uid=f"sim-{t}",
                prompt_ids=[],
                response_ids=[self._response] * g,
                behaviour_logprobs=[self._logprobs] * g,
                rewards=[0.0] * g,
                format_acc=[0.0] * g,
                ans_acc=[0.0] * g,
                truncated=[False] * g,
                policy_version=version,
                temperature=1.0,
                producer=p,
                ticket=t,
            )
            for t in res.tickets
        ]
        self.buffer.put(groups)
        self.reservations[p] = None
        self.producer_busy[p] = False

    # -- consumers -------------------------------------------------------------------------------

    def _try_consumer(self) -> bool:
        if self.consumer_busy or self.version >= self.shape.steps:
            return False
        status, batch = self.buffer.take(self.shape.train_batch_size, timeout=0, step=self.version)
        if status != "batch" or batch is None:
            return False
        self.staleness.append([batch.step - g.policy_version for g in batch.groups])
        samples = sum(g.group_size for g in batch.groups)
        self.consumer_busy = True
        step_s = self.step_s * self._draw(self.rates.train_spread)

        def train() -> None:
            self._start(
                "consumer", step_s, self.shape.consumers, lambda t: self._trained(t, samples)
            )

        # the take's round trip: the buffer's work (a core when cores are shared), the consumer
        # idle meanwhile; then the step
        self._start("buffer", self.rates.take_latency_s, 1, lambda _t: train())
        return True

    def _trained(self, t: float, samples: int) -> None:
        version = self.version + 1
        self._at(t + self.rates.weight_sync_s, lambda: self._publish(version))
        self._start(
            "consumer", self.rates.step_overhead_s, 1, lambda t2: self._advance(t2, samples)
        )

    def _publish(self, version: int) -> None:
        self.available = max(self.available, version)

    def _advance(self, t: float, samples: int) -> None:
        self.version += 1
        self.buffer.advance_version(self.version)
        self.step_ends.append(t)
        self.samples_per_step.append(samples)
        self.consumer_busy = False

    # -- figures ---------------------------------------------------------------------------------

    def prediction(self) -> Prediction:
        steps = self.shape.steps
        first = max(0, min(steps - 2, int(steps * WARMUP_FRACTION)))
        start = self.step_ends[first]
        first_step = first + 1  # the steps that end inside the window
        end = self.step_ends[-1]
        for a in self.activities:  # still running when the last step ended: busy until then
            self.busy.setdefault(a.owner, []).append((a.started, end))
        self.activities = []
        window = end - start
        trace = [x for step in self.staleness for x in step]
        steady = [x for step in self.staleness[first_step:] for x in step]
        samples = sum(self.samples_per_step[first_step:])
        n_steps = len(self.step_ends) - first_step
        producer_idle = [
            max(0.0, 1.0 - _covered(self.busy.get(f"producer-{p}", []), start, end) / window)
            for p in range(self.shape.producers)
        ]
        consumer_idle = max(0.0, 1.0 - _covered(self.busy.get("consumer", []), start, end) / window)
        return Prediction(
            shape=self.shape,
            samples_per_s=samples / window,
            steps_per_s=n_steps / window,
            producer_idle_frac=sum(producer_idle) / len(producer_idle),
            consumer_idle_frac=consumer_idle,
            mean_staleness=sum(steady) / len(steady),
            max_staleness=max(trace),
            step_s=self.step_s,
            producer_batch_s=producer_batch_seconds(
                self.rates, self.shape, self.shape.inference_batch_size
            ),
            groups_dropped_stale=self.buffer.stats.groups_dropped_stale,
            staleness_trace=trace,
        )


def _covered(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def simulate(rates: RunRates, shape: Shape) -> Prediction:
    """Simulate ``shape.steps`` training steps of ``shape`` with ``rates``."""
    _check(shape)
    cp = rates.context_parallel_size
    if shape.consumers % cp:
        raise ValueError(
            f"consumers must be a multiple of the run's training.engine.context_parallel_size="
            f"{cp} (its consumers form data-parallel slices of {cp}), got {shape.consumers}"
        )
    sim = _Simulation(rates, shape)
    sim.run()
    return sim.prediction()


def _check(shape: Shape) -> None:
    for name in ("producers", "consumers", "train_batch_size", "group_size", "steps"):
        if getattr(shape, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(shape, name)}")
    if shape.steps < 2:
        raise ValueError("steps must be >= 2 (the steady-state window needs two step ends)")
    if shape.max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {shape.max_staleness}")
    if shape.cores is not None and shape.cores < 1:
        raise ValueError(f"cores must be >= 1, got {shape.cores}")
    if shape.background_load < 0:
        raise ValueError(f"background load must be >= 0, got {shape.background_load}")
    if not 0 < shape.dp_efficiency <= 1:
        raise ValueError(f"dp_efficiency must be in (0, 1], got {shape.dp_efficiency}")
    if min(shape.inference_batch_size, shape.inference_microbatch_size) < 1:
        raise ValueError("inference batch sizes must be >= 1")
