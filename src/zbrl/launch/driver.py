"""The driver: builds everything from one RunConfig, places the workers on Ray, runs to the end,
turns any worker failure into a clear error, writes the run's summary, and shuts down cleanly."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zbrl.config import RunConfig, resolved_yaml
from zbrl.launch.failures import RunFailed, blame_shared_actor, outcome_of
from zbrl.launch.inputs import RunInputs, prepare_inputs
from zbrl.launch.preflight import preflight
from zbrl.launch.ray_setup import RayStart, init_ray
from zbrl.launch.resume import truncate_logs
from zbrl.launch.run_dir import (
    check_resumable_run_dir,
    check_run_dir,
    claim_run_dir,
    lock_existing_run_dir,
)
from zbrl.launch.signals import RunInterrupted, StopSignals, exit_code
from zbrl.launch.startup import StartupClock
from zbrl.launch.summary import add_startup, build_summary
from zbrl.telemetry.metrics import MetricsSink, MultiSink
from zbrl.telemetry.report import SUMMARY_FILE, render_report
from zbrl.training.checkpoint import Checkpoint, find_latest

# Everything above is light (no torch, transformers or Ray): the driver starts Ray as soon as the
# pre-flight checks pass and imports the rest while Ray starts (docs/performance.md, Start-up).
if TYPE_CHECKING:
    from zbrl.launch.monitor import RunMonitor
    from zbrl.launch.spawn import SharedActors, Spawner, Workers
    from zbrl.launch.supervisor import Outcome, Supervisor

__all__ = ["RunFailed", "RunInterrupted", "run_training"]


def run_training(
    cfg: RunConfig,
    resume: Checkpoint | None = None,
    sibling_if_used: bool = False,
    clock: StartupClock | None = None,
) -> dict[str, Any]:
    """Run one RL job end to end; returns the summary (also written to RUN_DIR/summary.json) and
    ``run_dir``, the directory used.

    ``resume``: a checkpoint of ``cfg.run_dir`` to continue from (see :mod:`zbrl.launch.resume`).
    Otherwise a run dir that holds checkpoints is refused (RunDirHasCheckpoints), unless
    ``sibling_if_used``, which gives the run a fresh sibling (as for a finished run without
    checkpoints). Raises RunInterrupted after a clean stop on SIGINT/SIGTERM, RunFailed when a
    worker failed. ``clock``: the start-up's phase marks so far (the command line's, whose origin
    is the process's start); None starts one now (:mod:`zbrl.launch.startup`).

    Nothing is claimed before the checks: the pre-flight checks, the run dir's refusals, the model
    and tokenizer, every prompt of every dataset (loaded, validated and encoded) and the wandb run
    all come first; a start that fails in any of them leaves no run directory behind. Ray starts
    in the background as soon as the pre-flight checks pass, while the inputs are prepared; a
    start that fails after that stops it again."""
    clock = clock or StartupClock(origin=time.time())
    sources = preflight(cfg)  # packages, reward, data files, addresses, GPUs, model, tokenizer
    check_run_dir_of(cfg, resume, sibling_if_used)  # in use, or holding checkpoints
    clock.mark("preflight")
    ray_start = RayStart(lambda: start_ray(cfg), stop_ray)  # while the inputs are prepared
    try:
        inputs = prepare_inputs(cfg, resume, sources)  # a bad dataset line fails here
        clock.mark("inputs")
        with contextlib.ExitStack() as stack:
            from zbrl.launch.monitor import local_sinks, remote_sinks

            remote = [stack.enter_context(contextlib.closing(s)) for s in remote_sinks(cfg)]
            run_dir = stack.enter_context(prepare_run_dir(cfg, resume, sibling_if_used))
            local = [stack.enter_context(contextlib.closing(s)) for s in local_sinks(cfg, run_dir)]
            print(f"[zbrl] run dir: {run_dir}", flush=True)
            clock.mark("run_dir")
            sink = MultiSink([*local, *remote])
            summary = _train(cfg, run_dir, inputs, sink, clock, ray_start)
    finally:
        ray_start.abandon()  # a start that failed before _train took Ray: stop what it started
    return {**summary, "run_dir": str(run_dir)}


@dataclass(frozen=True)
class RayUp:
    """Ray, up: whether this run started it, and the actors asked for as soon as it was."""

    started: bool
    """This run started Ray (and shuts it down)."""
    shared: SharedActors
    """The placement, telemetry hub, rollout buffer and weight store."""


def start_ray(cfg: RunConfig) -> RayUp:
    """Start (or join) Ray and ask for what needs nothing but the config (the driver's
    background start, :class:`zbrl.launch.ray_setup.RayStart`)."""
    from zbrl.launch.spawn import start_shared_actors

    started = init_ray(cfg)
    try:
        return RayUp(started, start_shared_actors(cfg))
    except BaseException:
        if started:
            import ray

            ray.shutdown()
        raise


def stop_ray(up: RayUp) -> None:
    """Undo :func:`start_ray` (a start that failed before the workers were created)."""
    up.shared.end()
    if up.started:
        import ray

        ray.shutdown()


def check_run_dir_of(cfg: RunConfig, resume: Checkpoint | None, sibling_if_used: bool) -> None:
    """Refuse a run dir that :func:`prepare_run_dir` would refuse, without creating it."""
    if resume is not None:
        check_resumable_run_dir(Path(cfg.run_dir))
    else:
        check_run_dir(Path(cfg.run_dir), sibling_if_used=sibling_if_used)


def _train(
    cfg: RunConfig,
    run_dir: Path,
    inputs: RunInputs,
    sink: MetricsSink,
    clock: StartupClock,
    ray_start: RayStart[RayUp],
) -> dict[str, Any]:
    from zbrl.launch.monitor import RunMonitor
    from zbrl.launch.placement import record_placement
    from zbrl.launch.spawn import create_workers
    from zbrl.transport.clients import HubClient
    from zbrl.transport.handles import RayHandle

    up = ray_start.result()
    clock.mark("ray_init")
    if ray_start.seconds is not None:
        clock.background["ray_start"] = ray_start.seconds
    workers: Workers | None = None
    with StopSignals() as signals:  # after ray.init, which installs its own SIGTERM handler
        try:
            workers, spawner = create_workers(
                cfg,
                inputs.artifacts,
                run_dir,
                inputs.train_prompts,
                inputs.eval_sets,
                inputs.total_steps,
                inputs.start,
                inputs.buffer_state,
                shared=up.shared,
            )
            clock.mark("actors")
            wait_until_ready(cfg, workers)
            clock.mark("workers_ready")
            record_placement(cfg, workers, run_dir)
            hub = HubClient(RayHandle(workers.hub))
            monitor = RunMonitor(
                cfg, run_dir, hub, inputs.total_steps, start_step=inputs.start.version, sink=sink
            )
            try:
                return execute(
                    cfg, workers, spawner, monitor, run_dir, signals, inputs.resume, clock
                )
            finally:
                monitor.close()
        except Exception as exc:
            blamed = blame_shared_actor(workers, exc) if workers is not None else None
            if blamed is not None:
                raise blamed from exc
            raise
        finally:
            if workers is None:  # the workers were never created: end the shared actors
                up.shared.end()
            shutdown(workers, up.started)
            ray_start.release()


@contextlib.contextmanager
def prepare_run_dir(
    cfg: RunConfig, resume: Checkpoint | None, sibling_if_used: bool
) -> Iterator[Path]:
    """The run's directory with its resolved config.yaml, locked while inside (see run_dir.py):
    for a resumed run ``cfg.run_dir`` itself, its logs cut back to the checkpoint's step;
    otherwise ``cfg.run_dir`` or a fresh sibling when that holds a finished run."""
    if resume is not None:
        run_dir, lock = lock_existing_run_dir(Path(cfg.run_dir))
    else:
        run_dir, lock = claim_run_dir(Path(cfg.run_dir), sibling_if_used=sibling_if_used)
    try:
        if resume is not None:
            truncate_logs(run_dir, resume.version)
        (run_dir / "config.yaml").write_text(resolved_yaml(cfg))
        yield run_dir
    finally:
        lock.release()


def wait_until_ready(cfg: RunConfig, workers: Workers, timeout_s: float = 900.0) -> None:
    """Block until every worker finished building its state (models loaded), or fail clearly."""
    refs = {a.__ray_ready__.remote(): name for a, name in workers.names.items()}
    _wait_all(refs, timeout_s, what="start-up")


def execute(
    cfg: RunConfig,
    workers: Workers,
    spawner: Spawner,
    monitor: RunMonitor,
    run_dir: Path,
    signals: StopSignals,
    resume: Checkpoint | None,
    clock: StartupClock | None = None,
) -> dict:
    from zbrl.launch.supervisor import Supervisor
    from zbrl.transport.clients import BufferClient
    from zbrl.transport.handles import RayHandle

    initial = _previous_initial_eval(run_dir) if resume is not None else None
    if workers.evaluator is not None and cfg.eval.at_start and resume is None:
        print("[zbrl] initial evaluation ...", flush=True)
        initial = _get(workers.evaluator.evaluate.remote(0, 0), "evaluator", timeout=1800)
        monitor.record_eval(0, initial)
    start = time.time()
    monitor.window_start = start
    supervisor = Supervisor(cfg, workers, spawner, monitor, signals)
    with signals.graceful():
        outcome = supervisor.run()
    end = time.time()
    consumer = next((r for n, r in outcome.results.items() if n.startswith("consumer")), None)
    steps = consumer.steps if consumer is not None else monitor.latest_step
    final = None
    if outcome.failure is None and outcome.stop_reason is None:
        final = _final_eval(supervisor, workers, monitor, steps)
    monitor.poll()
    buffer = BufferClient(RayHandle(workers.buffer))
    buffer_stats, failures = buffer.snapshot(), buffer.failure_log()
    summary = build_summary(
        monitor, outcome.results, buffer_stats, start, end, steps, initial, final
    )
    checkpoint = consumer.final_checkpoint if consumer is not None else None
    summary.update(
        workers=workers.where,
        producer_restarts=outcome.producer_restarts,
        consumer_restarts=outcome.consumer_restarts,
        evaluator_failures=outcome.evaluator_failures,
        reward_worker_restarts=outcome.reward_worker_restarts,
        interrupted=outcome.stop_reason,
        resumed_from=str(resume.path) if resume is not None else None,
        checkpoint=checkpoint,
        failed_groups_by_cause=failures["groups"],
        first_failure_by_cause=failures["first"],
    )
    if cfg.algorithm.distill is not None:
        from zbrl.evaluation.teacher import teacher_summary

        summary.update(teacher_summary(cfg, outcome.results, buffer_stats))
    if clock is not None:
        add_startup(summary, clock, run_dir)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print(render_report(run_dir), flush=True)
    _raise_if_ended_early(outcome, run_dir, checkpoint, signals)
    return summary


def _final_eval(supervisor: Supervisor, workers: Workers, monitor: RunMonitor, steps: int):
    if workers.evaluator is None:
        return None
    print("[zbrl] final evaluation ...", flush=True)
    for attempt in range(2):  # a failed evaluator is replaced once
        kind, value = outcome_of(
            workers.evaluator.evaluate.remote(steps, steps), "evaluator", timeout=1800
        )
        if kind == "ok":
            monitor.record_eval(steps, value)
            return value
        print(f"[zbrl] warning: final evaluation failed ({value})", file=sys.stderr, flush=True)
        if attempt == 0:
            supervisor.replace_evaluator()
    return None


def _raise_if_ended_early(
    outcome: Outcome, run_dir: Path, checkpoint: str | None, signals: StopSignals
) -> None:
    saved = (
        f"a resumable checkpoint is in {checkpoint}; continue with: zbrl resume {run_dir}"
        if checkpoint is not None
        else _no_checkpoint_note(run_dir)
    )
    if outcome.failure is not None:
        raise RunFailed(f"{outcome.failure}\n{saved}")
    if outcome.stop_reason is not None:
        late = " (the workers did not stop in time)" if outcome.stop_timed_out else ""
        message = f"interrupted by {outcome.stop_reason}{late}; {saved}"
        raise RunInterrupted(message, exit_code(signals.signum or 2))


def _no_checkpoint_note(run_dir: Path) -> str:
    latest = find_latest(run_dir / "checkpoints")
    if latest is None:
        return "no checkpoint was written"
    return f"the newest checkpoint is {latest.path}; continue with: zbrl resume {run_dir}"


def _previous_initial_eval(run_dir: Path) -> dict | None:
    """The first segment's initial evaluation, so a resumed run's summary still shows it."""
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text()).get("eval_initial")
    except (OSError, ValueError):
        return None


def shutdown(workers: Workers | None, started_ray: bool) -> None:
    import ray

    if workers is not None:
        for actor in workers.all():
            with contextlib.suppress(Exception):  # already dead
                ray.kill(actor, no_restart=True)
        if workers.placement is not None:
            workers.placement.remove()
    if started_ray:
        ray.shutdown()


def _get(ref: Any, name: str, timeout: float | None = None) -> Any:
    kind, value = outcome_of(ref, name, timeout)
    if kind != "ok":
        raise RunFailed(value)
    return value


def _wait_all(refs: dict[Any, str], timeout_s: float, what: str) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    pending = dict(refs)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RunFailed(
                f"{what}: {', '.join(sorted(pending.values()))} not ready in {timeout_s}s"
            )
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(remaining, 1.0))
        for ref in ready:
            _get(ref, pending.pop(ref))
