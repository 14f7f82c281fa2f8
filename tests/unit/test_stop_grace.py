"""The stop grace: sized from the run's longest train step and checkpoint write (or the weights'
size before the first write), overridable with launch.stop_grace_s."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from zbrl.config import RunConfig
from zbrl.launch.monitor import RunMonitor
from zbrl.launch.stop_grace import (
    ASSUMED_WRITE_BYTES_PER_S,
    CHECKPOINT_BYTES_PER_WEIGHT_BYTE,
    FLOOR_S,
    MARGIN,
    MeasuredTimes,
    estimated_checkpoint_s,
    stop_grace_s,
    weights_bytes,
)
from zbrl.telemetry.spans import CHECKPOINT, TRAIN_STEP, WAIT_FOR_DATA, Span

GB = 10**9


def test_measured_step_and_write_size_the_grace():
    grace = stop_grace_s(None, MeasuredTimes(longest_step_s=40.0, longest_checkpoint_s=300.0), 0)
    assert grace == pytest.approx(2.0 * (40.0 + 300.0) + 20.0)
    assert (MARGIN, FLOOR_S) == (2.0, 20.0)


def test_before_any_write_the_checkpoint_is_estimated_from_the_weights():
    seven_b_bf16 = 15 * GB
    grace = stop_grace_s(
        None, MeasuredTimes(longest_step_s=90.0, longest_checkpoint_s=None), seven_b_bf16
    )
    write = 15 * GB * 6.0 / 200e6  # fp32 masters and two fp32 moments, at 200 MB/s: 450 s
    assert estimated_checkpoint_s(seven_b_bf16) == pytest.approx(write) == pytest.approx(450.0)
    assert (CHECKPOINT_BYTES_PER_WEIGHT_BYTE, ASSUMED_WRITE_BYTES_PER_S) == (6.0, 200e6)
    assert grace == pytest.approx(2.0 * (90.0 + 450.0) + 20.0)
    assert grace > 25.0 * 30  # the old fixed 25 s could not have held this stop


def test_a_tiny_model_with_nothing_measured_gets_the_floor():
    nothing = MeasuredTimes(None, None)
    assert stop_grace_s(None, nothing, 0) == FLOOR_S
    assert stop_grace_s(None, nothing, 4_000_000) == pytest.approx(FLOOR_S + 2 * 0.12)


def test_the_setting_overrides_the_measurements():
    measured = MeasuredTimes(longest_step_s=500.0, longest_checkpoint_s=900.0)
    assert stop_grace_s(7.5, measured, 10 * GB) == 7.5


def test_the_setting_is_typed_and_positive():
    assert RunConfig().launch.stop_grace_s is None
    assert RunConfig.model_validate({"launch": {"stop_grace_s": 600}}).launch.stop_grace_s == 600
    with pytest.raises(ValueError, match="stop_grace_s"):
        RunConfig.model_validate({"launch": {"stop_grace_s": 0}})


def test_weights_bytes_counts_weight_files_only(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "optimizer.pt").write_bytes(b"x" * 10)
    (tmp_path / "config.json").write_text("{}" * 100)
    assert weights_bytes(tmp_path) == 1010
    assert weights_bytes(tmp_path / "missing") == 0


class FakeHub:
    def __init__(self, batches):
        self.batches = list(batches)

    def drain(self, timeout=None):
        spans = self.batches.pop(0) if self.batches else []
        return {"spans": [s.to_dict() for s in spans], "metrics": [], "events": []}


def test_the_monitor_keeps_the_longest_step_and_write(tmp_path):
    def span(name, start, end):
        return Span("consumer-0", "consumer", name, start, end)

    first = [span(TRAIN_STEP, 0, 2.0), span(WAIT_FOR_DATA, 2, 9.0), span(TRAIN_STEP, 9, 10.5)]
    second = [span(CHECKPOINT, 11, 14.0), span(TRAIN_STEP, 14, 17.0), span(CHECKPOINT, 17, 18)]
    cfg = SimpleNamespace(logging=SimpleNamespace(progress=False, tensorboard=False, wandb=False))
    monitor = RunMonitor(cfg, tmp_path, FakeHub([first, second]), total_steps=10)
    assert monitor.measured() == MeasuredTimes(None, None)
    monitor.poll()
    assert monitor.measured() == MeasuredTimes(longest_step_s=2.0, longest_checkpoint_s=None)
    monitor.poll()
    assert monitor.measured() == MeasuredTimes(longest_step_s=3.0, longest_checkpoint_s=3.0)
