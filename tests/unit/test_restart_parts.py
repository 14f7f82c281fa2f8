"""Pieces of a consumer restart that need no Ray: where the workers start again, and the run's
logs continuing from the checkpoint's step."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from zbrl.launch.monitor import RunMonitor
from zbrl.launch.resume import truncate_logs
from zbrl.launch.spawn import StartPoint, Workers, checkpoint_start
from zbrl.telemetry.metrics import JsonlSink, MultiSink


class QuietHub:
    def drain(self, timeout=None):
        return {"spans": [], "metrics": [], "events": []}


def test_after_a_rewind_metrics_continue_in_the_cut_back_file(tmp_path):
    cfg = SimpleNamespace(logging=SimpleNamespace(progress=False, tensorboard=False, wandb=False))
    sink = MultiSink([JsonlSink(tmp_path)])
    monitor = RunMonitor(cfg, tmp_path, QuietHub(), total_steps=10, sink=sink)
    for step in range(1, 6):
        monitor.step_metrics[step] = {"loss": float(step)}
        monitor.sink.log(step, {"loss": float(step)})
    monitor.latest_step = 5
    truncate_logs(tmp_path, 3)  # the restart cuts the logs back to the checkpoint (a new file)
    monitor.rewind(3)
    monitor.sink.log(4, {"loss": 40.0})
    sink.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    assert sorted(monitor.step_metrics) == [1, 2, 3] and monitor.latest_step == 3


def test_with_no_checkpoint_yet_the_workers_start_from_the_base_model(tmp_path):
    artifacts = SimpleNamespace(model_dir=tmp_path / "base")
    start, buffer_state = checkpoint_start(artifacts, None)
    assert start == StartPoint(model_dir=tmp_path / "base", version=0)
    assert buffer_state is None


def test_a_checkpoint_gives_its_weights_version_trainer_and_buffer_state(tmp_path):
    import torch

    (tmp_path / "zbrl").mkdir()
    torch.save({"ready": {}, "version": 7}, tmp_path / "zbrl" / "buffer.pt")
    checkpoint = SimpleNamespace(
        path=tmp_path,
        version=7,
        trainer_file=tmp_path / "zbrl" / "trainer.pt",
        buffer_file=tmp_path / "zbrl" / "buffer.pt",
    )
    start, buffer_state = checkpoint_start(SimpleNamespace(model_dir=Path("base")), checkpoint)
    assert start == StartPoint(tmp_path, 7, str(tmp_path / "zbrl" / "trainer.pt"))
    assert buffer_state == {"ready": {}, "version": 7}


def test_replaced_workers_are_the_ones_the_driver_shuts_down():
    old = Workers("b", "s", "h", ["p0"], ["c0"], None, names={"p0": "producer-0"})
    new = Workers("b2", "s2", "h", ["p1"], ["c1", "c2"], "e", names={"c1": "consumer-0"})
    held = old  # what the driver's shutdown holds
    old.replace_with(new)
    assert held.all() == ["p1", "c1", "c2", "b2", "s2", "h", "e"]
    assert held.names == {"c1": "consumer-0"}
