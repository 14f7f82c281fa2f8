"""The planner's model of an idle consumer that generates, online (``rollout.consumers_generate``).

A consumer that trains a step in ``T`` seconds and needs ``B`` groups per step, fed by producers
that deliver ``r_p`` groups per second, takes a step every ``max(T, B / r_p)`` seconds and waits
``1 - T / step`` of the time. If it generates ``r_c`` groups per second of its own whenever it
would wait, the groups of a step come from both: ``B = r_p * step + r_c * (step - T)``, so

    step_on = max(T, (B + r_c * T) / (r_p + r_c))

The generation batch a consumer is in when its data arrives delays that step, but its groups
count for the next one, so it costs no throughput unless it makes producers wait for admission
(the window fills while the consumer has not advanced), which the producers' rate measured while
the consumer generates (``r_p`` on) shows. Generating pays when ``step_on`` is shorter than
``step_off`` by more than :data:`MARGIN`; with producers on GPUs (vLLM) and the consumer on the
transformers backend, ``r_c`` is small and so is the gain, which this counts.

:class:`OnlinePlanner` feeds the model with the rates a consumer measures as it runs: its step
time, the groups the producers delivered per second (measured separately over the steps it
generated and the steps it did not, so that cores the two share are counted: on a shared CPU a
generating consumer slows the producers, and the rate it measures then says so) and its own
generation rate. Pure Python, here rather than in :mod:`zbrl.planning` (which stands above
``assembly``) because a consumer's own generation (:mod:`zbrl.rollout.consumer_generation`)
runs it; it is the steady state of the pipeline that ``zbrl plan`` simulates event by event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["auto", "on", "off"]

WARMUP_STEPS = 2
"""Steps measured before ``auto`` decides (the first ones carry start-up and compilation)."""
SMOOTHING = 0.3
"""Weight of the newest measurement in the running rates (an exponential moving average)."""
MARGIN = 0.02
"""``auto`` generates when the predicted step is at least this fraction shorter."""
PROBE_IDLE = 0.05
"""Predicted idle share above which ``auto`` tries generating before its own rate is known."""


@dataclass(frozen=True)
class IdleRates:
    """What the model needs (seconds and groups)."""

    train_s: float
    """Seconds a step keeps the consumer busy: the train step and its bookkeeping."""
    batch_groups: int
    """Groups a step trains (``B``)."""
    producer_groups_per_s: float
    """Groups the producers deliver per second while the consumer does not generate."""
    producer_groups_per_s_on: float | None
    """The same while the consumer generates (None: not measured yet; the figure above)."""
    consumer_groups_per_s: float | None
    """Groups the consumer makes per second of its own generation (None: not measured yet)."""


@dataclass(frozen=True)
class IdlePrediction:
    """The model's answer for one consumer."""

    step_s_off: float
    """Seconds per step when the consumer does not generate."""
    idle_off: float
    """Share of its time the consumer waits when it does not generate."""
    step_s_on: float | None
    """Seconds per step when it generates (None: its generation rate is not known yet)."""
    idle_on: float | None
    """Share of its time it waits when it generates: 0 in this model (it generates whenever it
    would wait); None as ``step_s_on``."""

    @property
    def generate(self) -> bool:
        """Generating shortens the step by more than :data:`MARGIN` (unknown rate: the
        predicted idle share without it is above :data:`PROBE_IDLE`, worth a try)."""
        if self.step_s_on is None:
            return self.idle_off > PROBE_IDLE
        return self.step_s_on < self.step_s_off * (1 - MARGIN)


def predict(rates: IdleRates) -> IdlePrediction:
    """The step time and idle share with and without consumer generation (module docstring)."""
    t, b = rates.train_s, rates.batch_groups
    r_p = max(rates.producer_groups_per_s, 1e-9)
    step_off = max(t, b / r_p)
    idle_off = 1.0 - t / step_off if step_off > 0 else 0.0
    r_c = rates.consumer_groups_per_s
    if r_c is None or r_c <= 0:
        return IdlePrediction(step_off, idle_off, None, None)
    r_p_on = r_p if rates.producer_groups_per_s_on is None else rates.producer_groups_per_s_on
    step_on = max(t, (b + r_c * t) / (max(r_p_on, 0.0) + r_c))
    return IdlePrediction(step_off, idle_off, step_on, 0.0)


class _Average:
    """An exponential moving average (None until the first value)."""

    def __init__(self) -> None:
        self.value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else SMOOTHING * x + (1 - SMOOTHING) * self.value


class OnlinePlanner:
    """Decides, step by step, whether an idle consumer generates (see the module docstring).

    ``mode`` ``on`` and ``off`` decide nothing (they still measure and predict, for the run's
    report); ``auto`` does not generate over the first :data:`WARMUP_STEPS` steps, then
    follows :attr:`IdlePrediction.generate`."""

    def __init__(self, mode: Mode, batch_groups: int) -> None:
        self.mode = mode
        self.batch_groups = batch_groups
        self.steps = 0
        self._train = _Average()
        self._producers_off = _Average()
        self._producers_on = _Average()
        self._consumer = _Average()
        self._gen_groups = 0
        self._gen_s = 0.0

    def add_generation(self, groups: int, seconds: float) -> None:
        """The consumer made ``groups`` in one generation batch of ``seconds``."""
        self._gen_groups += groups
        self._gen_s += seconds

    def add_step(
        self, train_s: float, step_s: float, producer_groups: int, generated: bool
    ) -> None:
        """A step ended: it kept the consumer busy ``train_s`` of its ``step_s`` seconds (from
        the previous step's end), and ``producer_groups`` of its groups came from producers;
        ``generated``: the consumer generated during it."""
        self.steps += 1
        if self.steps <= 1:  # the first step carries start-up
            self._gen_groups, self._gen_s = 0, 0.0
            return
        self._train.add(train_s)
        if step_s > 0:
            (self._producers_on if generated else self._producers_off).add(producer_groups / step_s)
        if self._gen_groups and self._gen_s > 0:
            self._consumer.add(self._gen_groups / self._gen_s)
        self._gen_groups, self._gen_s = 0, 0.0

    def rates(self) -> IdleRates | None:
        """The running rates (None before a step was measured)."""
        train = self._train.value
        producers = self._producers_off.value
        if producers is None:
            producers = self._producers_on.value
        if train is None or producers is None:
            return None
        return IdleRates(
            train_s=train,
            batch_groups=self.batch_groups,
            producer_groups_per_s=producers,
            producer_groups_per_s_on=self._producers_on.value,
            consumer_groups_per_s=self._consumer.value,
        )

    def prediction(self) -> IdlePrediction | None:
        rates = self.rates()
        return None if rates is None else predict(rates)

    def generate(self) -> bool:
        """Whether the consumer generates while it waits for its next step."""
        if self.mode != "auto":
            return self.mode == "on"
        if self.steps <= WARMUP_STEPS:
            return False
        prediction = self.prediction()
        return prediction is not None and prediction.generate

    def metrics(self) -> dict[str, float]:
        """The prediction as step metrics (``planned_*``); empty before there is one."""
        prediction = self.prediction()
        if prediction is None:
            return {}
        out = {
            "planned_step_s_off": prediction.step_s_off,
            "planned_consumer_idle_off": prediction.idle_off,
        }
        if prediction.step_s_on is not None and prediction.idle_on is not None:
            out["planned_step_s_on"] = prediction.step_s_on
            out["planned_consumer_idle_on"] = prediction.idle_on
        return out
