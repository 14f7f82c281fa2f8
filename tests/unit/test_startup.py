"""The start-up breakdown (issue 24, item 5): the driver's phases from the process's start, each
worker's ``startup`` span, and the summary and log line that join them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zbrl import cli
from zbrl.launch import driver
from zbrl.launch import summary as run_summary
from zbrl.launch.ray_setup import RayStart
from zbrl.launch.startup import (
    DRIVER_PHASES,
    StartupClock,
    process_start_time,
    startup_summary,
)
from zbrl.telemetry.report import render_report
from zbrl.telemetry.spans import GENERATE, STARTUP, TRAIN_STEP, WAIT_FOR_DATA, Span
from zbrl.telemetry.timeline import TimelineWriter

T0 = 1_000_000.0


def _clock() -> StartupClock:
    """A clock at T0 whose driver phases end 1, 2, ... 8 s after it."""
    clock = StartupClock(origin=T0)
    clock.marks = {phase: T0 + i for i, phase in enumerate(DRIVER_PHASES, start=1)}
    clock.background = {"ray_start": 2.5}
    return clock


def _run_spans() -> list[Span]:
    ready = T0 + len(DRIVER_PHASES)  # 8 s
    return [
        Span("consumer-0", "consumer", TRAIN_STEP, T0 - 50, T0 - 49),  # an earlier segment's
        Span("producer-0", "producer", STARTUP, T0 + 5.5, T0 + 7.5, attrs={"imports_s": 1.25}),
        Span("consumer-0", "consumer", STARTUP, T0 + 5.5, T0 + 8.0, attrs={"trainer_s": 0.5}),
        Span("producer-0", "producer", GENERATE, ready + 0.1, ready + 1.5),
        Span("producer-0", "producer", GENERATE, ready + 1.6, ready + 2.6),
        Span("consumer-0", "consumer", WAIT_FOR_DATA, ready, ready + 1.6),
        Span("consumer-0", "consumer", TRAIN_STEP, ready + 1.6, ready + 2.25),
        Span("consumer-0", "consumer", TRAIN_STEP, ready + 2.7, ready + 3.2),
    ]


def test_the_summary_and_the_log_carry_the_startup_breakdown(tmp_path, capsys):
    TimelineWriter(tmp_path).write(_run_spans())
    summary: dict = {"steps": 2}
    run_summary.add_startup(summary, _clock(), tmp_path)

    assert summary["startup_s"] == pytest.approx(10.25)  # the first train step's end since T0
    parts = summary["startup"]
    assert list(parts) == [*DRIVER_PHASES, "first_generation", "first_train_step"]
    assert all(parts[p] == pytest.approx(1.0) for p in DRIVER_PHASES)
    assert parts["first_generation"] == pytest.approx(1.5)
    assert parts["first_train_step"] == pytest.approx(0.75)
    assert sum(parts.values()) == pytest.approx(summary["startup_s"])
    assert summary["startup_background"] == {"ray_start": 2.5}
    assert summary["startup_workers"] == {
        "producer-0": {"total_s": 2.0, "imports_s": 1.25},
        "consumer-0": {"total_s": 2.5, "trainer_s": 0.5},
    }
    line = capsys.readouterr().out.strip()
    assert line.startswith("[zbrl] start-up: 10.25 s to the end of the first training step (")
    assert "imports 1.00" in line and "first_train_step 0.75" in line
    json.dumps(summary)  # summary.json takes it as it is


def test_a_run_without_a_training_step_says_so():
    clock = _clock()
    spans = [s for s in _run_spans() if s.name != TRAIN_STEP]
    out = startup_summary(clock, spans)
    assert out["startup_s"] is None
    assert "first_train_step" not in out["startup"] and "first_generation" in out["startup"]


def test_phases_not_marked_count_in_the_next_one():
    clock = StartupClock(origin=T0)  # run_training called from Python: no imports/config marks
    clock.marks = {"preflight": T0 + 2.0, "ray_init": T0 + 5.0}
    parts = clock.parts(None, T0 + 6.5)
    assert parts == {"preflight": 2.0, "ray_init": 3.0, "first_train_step": 1.5}
    with pytest.raises(ValueError, match="unknown start-up phase 'warmup'"):
        clock.mark("warmup")


def test_the_startup_spans_leave_the_reports_idle_shares_as_they_were(tmp_path):
    working = _run_spans()[3:]
    TimelineWriter(tmp_path / "without").write(working)
    TimelineWriter(tmp_path / "with").write(_run_spans()[1:])
    without = render_report(tmp_path / "without").splitlines()
    with_startup = render_report(tmp_path / "with").splitlines()
    idle_line = next(line for line in without if line.startswith("mean idle fraction"))
    assert idle_line in with_startup
    assert "consumer 50.0%" in idle_line  # 1.6 s waiting in 3.2 s (28% counting start-up)


def test_process_start_time_is_when_the_process_began():
    before = time.time()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        started = process_start_time(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert started is not None
    assert before - 0.05 <= started <= time.time() + 0.05
    assert process_start_time() < before  # this process began before the test


def test_zbrl_train_times_from_the_process_start(monkeypatch, tmp_path):
    seen = {}

    def fake_run_training(cfg, *, sibling_if_used, clock):
        seen["clock"] = clock
        return {"steps": 0, "wall_s": 0.0, "run_dir": str(tmp_path)}

    monkeypatch.setattr(driver, "run_training", fake_run_training)
    before = time.time()
    assert cli.main(["train", str(cli.DEMO_RECIPE), f"logging.run_dir={tmp_path}"]) == 0
    clock = seen["clock"]
    assert clock.origin < before  # the process's start, not the command's
    assert list(clock.marks) == ["imports", "config"]
    assert before <= clock.marks["imports"] <= clock.marks["config"] <= time.time()


def test_the_driver_marks_each_phase_before_ray(tmp_path, tiny_model_dir, task_files, monkeypatch):
    class ReachedRay(Exception):
        pass

    def refuse(cfg):
        raise ReachedRay

    monkeypatch.setattr(driver, "init_ray", refuse)
    cfg = cli_config(tmp_path, tiny_model_dir, task_files)
    clock = StartupClock(origin=time.time())
    with pytest.raises(ReachedRay):
        driver.run_training(cfg, clock=clock)
    assert list(clock.marks) == ["preflight", "inputs", "run_dir"]
    assert sorted(clock.marks.values()) == list(clock.marks.values())


def cli_config(tmp_path: Path, model: Path, task: tuple[Path, Path]):
    from zbrl.config import load_config

    return load_config(
        str(cli.DEMO_RECIPE),
        [
            f"model.path={model}",
            f"data.train_path={task[0]}",
            "eval.sets={}",
            f"logging.run_dir={tmp_path}/run",
            f"logging.cache_dir={tmp_path}/cache",
        ],
    )


# -- Ray starts in the background while the inputs are prepared ----------------------------------


def test_the_background_start_hands_over_its_value_and_holds_rays_log_lines(caplog):
    import logging

    def start():
        logging.getLogger("ray.fake").warning("a notice Ray prints while it starts")
        return "up"

    stopped = []
    with caplog.at_level(logging.WARNING, logger="ray"):
        ray_start = RayStart(start, stopped.append)
        ray_start._ready.wait(10)
        assert "a notice" not in caplog.text  # held while the driver prepares the inputs
        assert ray_start.result() == "up"
        assert "a notice Ray prints while it starts" in caplog.text  # printed once Ray is taken
    ray_start.abandon()  # after result(): nothing to undo
    ray_start.release()
    assert stopped == [] and ray_start.seconds is not None


def test_a_start_that_fails_undoes_rays_start_and_drops_its_log_lines(caplog):
    import logging

    def start():
        logging.getLogger("ray.fake").warning("a notice Ray prints while it starts")
        return "up"

    stopped = []
    with caplog.at_level(logging.WARNING, logger="ray"):
        ray_start = RayStart(start, stopped.append)
        ray_start.abandon()  # the inputs failed: wait, undo, say nothing of Ray
    assert stopped == ["up"]
    assert "a notice" not in caplog.text
    assert not ray_start._thread.is_alive() or ray_start._released.is_set()


def test_rays_own_failure_is_raised_by_result_and_not_undone():
    def start():
        raise RuntimeError("no Ray today")

    stopped = []
    failing = RayStart(start, stopped.append)
    with pytest.raises(RuntimeError, match="no Ray today"):
        failing.result()
    RayStart(start, stopped.append).abandon()  # nothing started: nothing to undo
    assert stopped == []


def test_the_start_until_ray_imports_neither_torch_nor_ray(tmp_path):
    """``zbrl train`` reaches the point where Ray starts (config, pre-flight, run-dir checks)
    without importing torch, transformers or Ray: the rest is imported while Ray starts."""
    script = f"""
import sys
from zbrl import cli
from zbrl.config import load_config
from zbrl.launch import driver
from zbrl.launch.preflight import preflight
cfg = load_config({str(cli.DEMO_RECIPE)!r}, ["logging.run_dir={tmp_path}/run"])
preflight(cfg)
driver.check_run_dir_of(cfg, None, False)
cli.build_parser()
print(sorted(m for m in ("torch", "transformers", "ray") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_driver_creates_every_actor_without_torch(tmp_path):
    """What the driver imports to create and supervise a run's actors (the shared actors' classes
    and settings, the placement, the worker shells, the supervisor and the monitor) imports no
    torch or transformers: those load in the workers' processes, while the driver waits on them
    (docs/performance.md, Start-up); the rollout buffer's process needs none either
    (``test_buffer.py``). The worker shells answer their roles' methods."""
    script = f"""
import sys
from zbrl.config import load_config
from zbrl.launch import driver, monitor, placement, process_group, spawn, supervisor, workers
from zbrl.transport.buffer import RolloutBuffer
from zbrl.assembly.shared_settings import buffer_settings, weight_sync_backend
from zbrl.telemetry.hub import TelemetryHub
from zbrl.transport.weight_sync.store import WeightStore
cfg = load_config({str(cli_demo_recipe())!r}, ["logging.run_dir={tmp_path}/run"])
settings = buffer_settings(cfg)
assert process_group.consumer_group(cfg) == (None, None)
assert weight_sync_backend(cfg) == "none"
RolloutBuffer(settings)
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    from zbrl.launch import worker_roles, workers

    for shell, role in (
        (workers.ProducerWorker, worker_roles.ProducerRole),
        (workers.ConsumerWorker, worker_roles.ConsumerRole),
        (workers.EvaluatorWorker, worker_roles.EvaluatorRole),
    ):
        methods = {n for n in vars(role) if not n.startswith("_")}
        assert methods == {n for n in dir(shell) if not n.startswith("_")}, shell


def cli_demo_recipe():
    from zbrl import cli

    return cli.DEMO_RECIPE


def test_a_local_raylet_may_start_the_runs_workers_at_once(monkeypatch):
    """Inside ``workers_start_at_once`` the raylet's command line lets it start 8 worker
    processes at once (Ray computes min(cores, num_cpus): 2 here); other processes' command
    lines and a larger limit are left alone, and Ray's function is back afterwards."""
    from ray._private import services

    from zbrl.launch.local_ray.replacements import workers_start_at_once

    started = []

    def start_ray_process(command, process_type, **kwargs):
        started.append((process_type, command))

    monkeypatch.setattr(services, "start_ray_process", start_ray_process)
    with workers_start_at_once() as active:
        assert active
        services.start_ray_process(
            ["raylet", "--maximum_startup_concurrency=2", "--num_cpus=3"], "raylet"
        )
        services.start_ray_process(["raylet", "--maximum_startup_concurrency=16"], "raylet")
        services.start_ray_process(["gcs_server", "--port=0"], "gcs_server")
    assert services.start_ray_process is start_ray_process
    assert started == [
        ("raylet", ["raylet", "--maximum_startup_concurrency=8", "--num_cpus=3"]),
        ("raylet", ["raylet", "--maximum_startup_concurrency=16"]),
        ("gcs_server", ["gcs_server", "--port=0"]),
    ]


def test_a_local_raylet_gets_zbrls_worker_program_where_ray_takes_one(monkeypatch):
    """Inside ``light_worker_setup`` the raylet is started with ``worker_exec`` as its worker
    program; a ``start_raylet`` that takes no ``setup_worker_path`` is left alone (False)."""
    from ray._private import services

    from zbrl.launch.local_ray import worker_exec
    from zbrl.launch.local_ray.replacements import light_worker_setup

    seen = []

    def start_raylet(redis_address, setup_worker_path="ray's", fate_share=None):
        seen.append((redis_address, setup_worker_path, fate_share))

    monkeypatch.setattr(services, "start_raylet", start_raylet)
    with light_worker_setup() as active:
        assert active
        services.start_raylet("gcs", "given", fate_share=True)
    assert services.start_raylet is start_raylet
    assert seen == [("gcs", worker_exec.__file__, True)]

    def older_start_raylet(redis_address, fate_share=None):
        raise AssertionError("not called")

    monkeypatch.setattr(services, "start_raylet", older_start_raylet)
    with light_worker_setup() as active:
        assert not active
        assert services.start_raylet is older_start_raylet
