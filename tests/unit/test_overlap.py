"""Overlap figures (telemetry/overlap.py) on hand-built timelines, and the driver's monitor keeping
only recent spans in memory while the end-of-run figures come from the timeline on disk."""

from types import SimpleNamespace

import pytest

from zbrl.launch.monitor import LIVE_WINDOW_S, RunMonitor
from zbrl.telemetry.overlap import overlap, steady_window
from zbrl.telemetry.spans import GENERATE, SCORE, TRAIN_STEP, WAIT_FOR_DATA, WAIT_FOR_WEIGHTS, Span


def lockstep(steps=11, train=0.6, producers=(("producer-0", 0.8),)):
    """Step k occupies [k, k + 1]: the consumer trains ``train`` s then waits; each producer
    generates for its share then waits for admission."""
    spans = []
    for k in range(steps):
        spans.append(
            Span("consumer-0", "consumer", TRAIN_STEP, k, k + train, attrs={"step": k, "groups": 4})
        )
        spans.append(Span("consumer-0", "consumer", WAIT_FOR_DATA, k + train, k + 1))
        for name, busy in producers:
            spans.append(Span(name, "producer", GENERATE, k, k + busy * 0.75))
            spans.append(Span(name, "producer", SCORE, k + busy * 0.75, k + busy))
            spans.append(Span(name, "producer", WAIT_FOR_WEIGHTS, k + busy, k + 1))
    return spans


def test_steady_window_skips_the_first_tenth_of_the_steps():
    w = steady_window(lockstep())
    # 11 steps: the window opens at the end of step 1 (int(11 * 0.1) = 1), closes at step 10's
    assert (w.start, w.end, w.steps, w.groups) == (1.6, 10.6, 9, 36)
    assert steady_window(lockstep(steps=1)) is None


def test_overlap_figures_against_hand_computed_values():
    o = overlap(lockstep())
    # window [1.6, 10.6], 9 steps; consumer waits 0.4 s in each of 9 steps: busy 5.4 s -> t = 0.6
    # producer waits 0.2 s in each of 9 steps (k = 1..9): busy 7.2 s -> g = 0.8
    assert o.steps == 9 and o.window_s == pytest.approx(9.0)
    assert o.training_s_per_step == pytest.approx(0.6)
    assert o.generation_s_per_step == pytest.approx(0.8)
    assert o.ideal_speedup == pytest.approx(1.4 / 0.8)
    assert o.achieved_speedup == pytest.approx(1.4)
    assert o.overlap_efficiency == pytest.approx(0.8)  # the producer idles 20% of each step
    # generate: 0.6 s per step (k = 2..10 inside the window) of the producer's 7.2 busy seconds
    assert o.producer_generate_frac == pytest.approx(9 * 0.6 / 7.2)


def test_producers_working_side_by_side_share_a_step():
    two = overlap(lockstep(producers=(("producer-0", 0.9), ("producer-1", 0.5))))
    # side by side, busy 0.9 and 0.5 s of each 1 s step: one step's rollouts take 0.7 s of both
    assert two.generation_s_per_step == pytest.approx(0.7)
    assert two.overlap_efficiency == pytest.approx(0.7)
    assert overlap([s for s in lockstep() if s.role == "consumer"]) is None


def test_perfect_overlap_is_one():
    o = overlap(lockstep(train=1.0, producers=(("producer-0", 1.0),)))
    assert o.overlap_efficiency == pytest.approx(1.0)
    assert o.ideal_speedup == pytest.approx(2.0) and o.achieved_speedup == pytest.approx(2.0)


class FakeHub:
    def __init__(self, batches):
        self.batches = list(batches)

    def drain(self, timeout=None):
        spans = self.batches.pop(0) if self.batches else []
        return {"spans": [s.to_dict() for s in spans], "metrics": [], "events": []}


def test_monitor_keeps_recent_spans_and_reads_the_run_from_disk(tmp_path):
    spans = lockstep(steps=11)
    late = [  # a step long after: everything before it leaves the in-memory window
        Span("consumer-0", "consumer", TRAIN_STEP, 500.0, 500.6, attrs={"step": 11, "groups": 4})
    ]
    cfg = SimpleNamespace(logging=SimpleNamespace(progress=False, tensorboard=False, wandb=False))
    monitor = RunMonitor(cfg, tmp_path, FakeHub([spans, late]), total_steps=12)
    monitor.window_start = 0.0
    monitor.poll()
    assert len(monitor.recent) == len(spans)
    monitor.poll()
    assert list(monitor.recent) == late  # older spans are only on disk now
    assert all(s.end >= 500.6 - LIVE_WINDOW_S for s in monitor.recent)
    idle, figures = monitor.run_figures(end=11.0)
    assert idle["consumer"] == pytest.approx(11 * 0.4 / 11.0)
    assert figures == overlap(spans + late)  # the whole run, from timeline.jsonl
