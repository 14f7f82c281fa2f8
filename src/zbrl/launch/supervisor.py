"""The driver's loop while a run trains.

It waits on the roles' ``run`` calls, drains telemetry, schedules evaluations, and handles what
goes wrong without ending the run when it need not:

- a producer whose **process died** is re-created (up to ``launch.max_producer_restarts`` in
  all): the buffer drops its pending tickets and hands back its last resume point
  (``RolloutBuffer.reclaim``), the new producer loads the newest weights, continues its shard
  from there and regenerates the prompts of the dropped tickets; nothing is lost or trained twice.
  A producer that *raised* (a bug, a failing reward) is not restarted: it would fail again.
- a **consumer** whose process died (any rank of a data-parallel group) is replaced, up to
  ``launch.max_consumer_restarts`` in all, by re-creating every actor but the telemetry hub from
  the newest checkpoint (:meth:`Supervisor._restart_from_checkpoint`): the consumers hold the
  optimizer state and the version, the buffer and the producers hold what was generated for the
  steps after it, so they all go back to that checkpoint together, the run's step logs are cut
  back to it and the steps since are trained again (docs/survival.md says what that means).
- a **reward worker** whose process died is restarted by Ray (``reward.worker_max_restarts``
  each); the restarts are counted, and a worker dead past its budget ends the run, naming it.
- an **evaluator** that fails is reported as a warning and re-created; evaluations due while it
  is away are skipped.
- a run that **trains nothing** (groups failing in a row, or no step for a long time:
  ``launch.no_progress``, :mod:`zbrl.launch.progress_watch`) is stopped as a failure the
  consumer survives, with one line naming the cause seen most and its fix.
- the first **SIGINT/SIGTERM** (see :mod:`zbrl.launch.signals`), and a failure that ends the run
  while the consumer lives, ask the buffer to stop: producers get no more admission, the consumer
  finishes its step and writes a resumable checkpoint, and every role returns.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from zbrl.config import RunConfig
from zbrl.launch.failures import RunFailed, blame_shared_actor, outcome_of
from zbrl.launch.monitor import RunMonitor
from zbrl.launch.placement import record_placement
from zbrl.launch.progress_watch import ProgressWatch
from zbrl.launch.resume import truncate_logs
from zbrl.launch.reward_workers import RewardWorkerWatch
from zbrl.launch.run_dir import CHECKPOINTS
from zbrl.launch.signals import StopSignals
from zbrl.launch.spawn import Spawner, Workers, checkpoint_start
from zbrl.launch.stop_grace import stop_grace_s, weights_bytes
from zbrl.telemetry.spans import RESTART
from zbrl.training.checkpoint import find_latest
from zbrl.transport.clients import BufferClient
from zbrl.transport.handles import RayHandle

READY_TIMEOUT_S = 900.0
PROGRESS_POLL_S = 2.0
"""How often the loop reads the buffer's failure log for the no-progress watch."""
POLL_S = 0.5
"""How often the loop drains the telemetry hub (metrics, spans, progress) once steps arrive."""
FIRST_POLL_S = 0.1
"""How often it drains the hub until the first step's metrics arrived: the first metrics line
is what a user waits for at the start (docs/performance.md, Start-up); a drain costs the driver
and the hub about a millisecond."""
END_TIMEOUT_S = 60.0
"""How long a consumer restart waits for the old workers' processes to be gone."""
"""How long a re-created producer may take to build its model and backend."""


@dataclass
class Outcome:
    """How the training loop ended."""

    results: dict[str, Any]
    """Each role's result by worker name (roles that did not return are missing)."""
    stop_reason: str | None = None
    """``SIGINT``/``SIGTERM`` when a signal stopped the run, else None."""
    failure: RunFailed | None = None
    """What ended the run early, if anything did."""
    stop_timed_out: bool = False
    """The roles did not return within the stop grace (:mod:`zbrl.launch.stop_grace`)."""
    producer_restarts: int = 0
    consumer_restarts: int = 0
    """Times the consumers died and every worker was re-created from the newest checkpoint."""
    evaluator_failures: int = 0
    reward_worker_restarts: int = 0
    """Times Ray restarted a reward worker whose process died."""
    evals: dict[int, dict] = field(default_factory=dict)


def _alive(actor: Any, timeout_s: float = 10.0) -> bool:
    """False when ``actor``'s process is known to be gone."""
    import ray

    try:
        ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
    except ray.exceptions.RayActorError:
        return False
    except ray.exceptions.RayError:
        pass  # busy, or Ray going down: not known dead
    return True


class Supervisor:
    """Runs the roles to the end (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        workers: Workers,
        spawner: Spawner,
        monitor: RunMonitor,
        signals: StopSignals,
    ) -> None:
        self.cfg = cfg
        self.workers = workers
        self.spawner = spawner
        self.monitor = monitor
        self.signals = signals
        self.buffer = BufferClient(RayHandle(workers.buffer))
        self.outcome = Outcome(results={})
        self._running: dict[Any, str] = {}
        self._restarting: dict[Any, tuple[int, float]] = {}  # ready ref -> (index, since)
        self._stop_deadline: float | None = None
        self._eval_ref: Any = None
        self._next_eval = cfg.eval.interval or None
        self._weights_bytes = weights_bytes(spawner.start.model_dir)
        budget = getattr(cfg.reward, "worker_max_restarts", 0)
        self._reward_watch = RewardWorkerWatch(workers.reward_workers, budget)
        self._progress = ProgressWatch(
            cfg.launch.no_progress, monitor.latest_step, step_at=time.time()
        )
        self._progress_read_at = 0.0

    def run(self) -> Outcome:
        import ray

        w = self.workers
        self._running = {c.run.remote(): w.names[c] for c in w.consumers}
        self._running.update({p.run.remote(): w.names[p] for p in w.producers})
        while self._running or self._restarting:
            self._check_stop()
            if self._stop_deadline is not None and time.monotonic() > self._stop_deadline:
                self.outcome.stop_timed_out = True
                break
            refs = [*self._running, *self._restarting]
            poll_s = POLL_S if self.monitor.step_metrics else FIRST_POLL_S
            ready, _ = ray.wait(refs, num_returns=1, timeout=poll_s)
            for ref in ready:
                if ref in self._restarting:
                    self._on_restarted(ref)
                else:
                    self._on_returned(ref, self._running.pop(ref))
            self.monitor.poll()
            self._watch_reward_workers()
            self._watch_progress()
            self._evaluate_when_due()
        if self._eval_ref is not None and self._stop_deadline is None:
            self._collect_eval(timeout=1800)
        return self.outcome

    # -- roles -----------------------------------------------------------------------------------

    def _on_returned(self, ref: Any, name: str) -> None:
        kind, value = outcome_of(ref, name)
        if kind == "ok":
            self.outcome.results[name] = value
            return
        self._on_failed(name, kind, value)

    def _on_failed(self, name: str, kind: str, message: str) -> None:
        failure = RunFailed(message)
        blamed = blame_shared_actor(self.workers, failure)
        if blamed is not None:  # it failed because a shared actor died: nothing can save
            self._fail(blamed, consumer_lives=False)
        elif kind == "died" and name.startswith("producer-") and self._restarts_left():
            self._restart_producer(int(name.split("-")[1]), message)
        elif self._consumer_died(name, kind) and self._consumer_restarts_left():
            self._restart_from_checkpoint(message)
        else:
            self._fail(failure, consumer_lives=not name.startswith("consumer-"))

    def _restarts_left(self) -> bool:
        stopping = self._stop_deadline is not None or self.signals.requested
        return (
            not stopping and self.outcome.producer_restarts < self.cfg.launch.max_producer_restarts
        )

    def _consumer_died(self, name: str, kind: str) -> bool:
        """A consumer's process died; or a data-parallel rank failed and another rank's process
        is gone (a collective with a dead rank fails on the ranks that live)."""
        if not name.startswith("consumer-"):
            return False
        if kind == "died":
            return True
        return len(self.workers.consumers) > 1 and any(
            not _alive(c) for c in self.workers.consumers
        )

    def _consumer_restarts_left(self) -> bool:
        stopping = self._stop_deadline is not None or self.signals.requested
        budget = self.cfg.launch.max_consumer_restarts
        return not stopping and self.outcome.consumer_restarts < budget

    def _restart_from_checkpoint(self, cause: str) -> None:
        """Re-create every actor but the telemetry hub from the newest checkpoint (the base model
        when there is none yet) and go on training from its step."""
        since = time.time()
        self.outcome.consumer_restarts += 1
        n, budget = self.outcome.consumer_restarts, self.cfg.launch.max_consumer_restarts
        run_dir = self.spawner.run_dir
        checkpoint = find_latest(run_dir / CHECKPOINTS)
        start, buffer_state = checkpoint_start(self.spawner.artifacts, checkpoint)
        where = checkpoint.path if checkpoint is not None else "the start (no checkpoint yet)"
        print(
            f"[zbrl] {cause}; restarting every worker from {where}, step {start.version} "
            f"({n} of {budget} consumer restarts)",
            file=sys.stderr,
            flush=True,
        )
        self._end_workers()
        self.monitor.poll()  # what they sent before they died, before the logs are cut back
        truncate_logs(run_dir, start.version)  # the steps after it are trained again
        self.monitor.rewind(start.version)
        workers, self.spawner = self.spawner.respawn(start, buffer_state)
        self.workers.replace_with(workers)
        self._reward_watch.track(workers.reward_workers)
        self.buffer = BufferClient(RayHandle(workers.buffer))
        try:
            self._wait_until_ready()
            record_placement(self.cfg, self.workers, run_dir)  # where the new workers run
        except RunFailed as exc:
            self._fail(RunFailed(f"the consumer restart failed: {exc}"), consumer_lives=False)
            return
        self.monitor.record_span("consumer-0", "consumer", RESTART, since, time.time())
        self.monitor.log_event(start.version, {"consumer_restarts": float(n)})
        w = self.workers
        self._running = {c.run.remote(): w.names[c] for c in w.consumers}
        self._running.update({p.run.remote(): w.names[p] for p in w.producers})

    def _end_workers(self) -> None:
        """Kill every actor but the telemetry hub (their placement stays reserved)."""
        import ray

        w = self.workers
        shared = (w.evaluator, w.buffer, w.store, *w.reward_workers)  # all re-created
        actors = [a for a in (*w.producers, *w.consumers, *shared) if a]
        for actor in actors:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + END_TIMEOUT_S
        for actor in actors:  # gone, so that none writes a log line or a metric after this
            while _alive(actor, timeout_s=1.0) and time.monotonic() < deadline:
                time.sleep(0.1)
        for ref in [*self._running, *self._restarting]:  # their errors are expected: read them,
            with contextlib.suppress(Exception):  # or Ray prints each as an "Unhandled error"
                ray.get(ref, timeout=1.0)
        self._running.clear()
        self._restarting.clear()
        self._eval_ref = None  # the old evaluator's: it is gone
        self.outcome.results.clear()

    def _wait_until_ready(self) -> None:
        import ray

        refs = {a.__ray_ready__.remote(): name for a, name in self.workers.names.items()}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while refs:
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(refs.values()))
                raise RunFailed(f"{missing} not ready in {READY_TIMEOUT_S:.0f}s")
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
            for ref in ready:
                name = refs.pop(ref)
                kind, value = outcome_of(ref, name)
                if kind != "ok":
                    raise RunFailed(value)
            self.monitor.poll()

    def _watch_reward_workers(self) -> None:
        lines, dead = self._reward_watch.poll(time.monotonic())
        for line in lines:
            print(f"[zbrl] warning: {line}", file=sys.stderr, flush=True)
        if lines:
            restarts = self.outcome.reward_worker_restarts = self._reward_watch.restarts
            self.monitor.log_event(
                self.monitor.latest_step, {"reward_worker_restarts": float(restarts)}
            )
        if dead is not None and self.outcome.failure is None:
            self._fail(RunFailed(dead), consumer_lives=True)

    def _watch_progress(self) -> None:
        now = time.time()
        if now - self._progress_read_at < PROGRESS_POLL_S or self._stop_deadline is not None:
            return
        self._progress_read_at = now
        verdict = self._progress.verdict(self.monitor.latest_step, now, self.buffer.failure_log())
        if verdict is not None and self.outcome.failure is None:
            print("[zbrl] no progress: stopping the run", file=sys.stderr, flush=True)
            self._fail(RunFailed(verdict), consumer_lives=True, announce=False)

    def _restart_producer(self, index: int, cause: str) -> None:
        since = time.time()
        self.outcome.producer_restarts += 1
        n, budget = self.outcome.producer_restarts, self.cfg.launch.max_producer_restarts
        print(
            f"[zbrl] {cause}; restarting producer-{index} ({n} of {budget} restarts)",
            file=sys.stderr,
            flush=True,
        )
        resume_state = self.buffer.reclaim(index)[index]
        old = self.workers.producers[index]
        self.workers.names.pop(old, None)
        new = self.spawner.producer(index, resume_state)
        self.workers.producers[index] = new
        self.workers.names[new] = f"producer-{index}"
        self._restarting[new.__ray_ready__.remote()] = (index, since)
        self.monitor.log_event(
            self.monitor.latest_step, {"producer_restarts": float(self.outcome.producer_restarts)}
        )

    def _on_restarted(self, ref: Any) -> None:
        index, since = self._restarting.pop(ref)
        name = f"producer-{index}"
        kind, value = outcome_of(ref, name)
        self.monitor.record_span(name, "producer", RESTART, since, time.time())
        if kind != "ok":
            self._on_failed(name, kind, f"{name} failed to restart: {value}")
            return
        if self._stop_deadline is not None:
            return  # stopping: the new producer would get no admission anyway
        producer = self.workers.producers[index]
        self._running[producer.run.remote()] = name

    def _fail(self, failure: RunFailed, consumer_lives: bool, announce: bool = True) -> None:
        """``announce``: print the error now (else only the command's final ``error:`` line
        says it)."""
        if self.outcome.failure is None:
            self.outcome.failure = failure
            if announce:
                print(f"[zbrl] error: {failure}", file=sys.stderr, flush=True)
        if consumer_lives and self._stop_deadline is None:
            self._request_stop()  # the consumer saves a resumable checkpoint and returns
        elif not consumer_lives:
            self._running.clear()  # nothing can save a checkpoint: end now
            self._restarting.clear()

    # -- stopping --------------------------------------------------------------------------------

    def _check_stop(self) -> None:
        if self.signals.requested and self.outcome.stop_reason is None:
            self.outcome.stop_reason = self.signals.name
            if self._stop_deadline is None:
                self._request_stop()

    def _request_stop(self) -> None:
        self.monitor.poll()  # the newest step and checkpoint times
        grace = self.stop_grace_s()
        self._stop_deadline = time.monotonic() + grace
        print(
            f"[zbrl] waiting up to {grace:.0f}s for the current step and the stop checkpoint "
            "(launch.stop_grace_s)",
            file=sys.stderr,
            flush=True,
        )
        self.buffer.request_stop()

    def stop_grace_s(self) -> float:
        """How long a stop waits now: ``launch.stop_grace_s``, or sized from the run's longest
        step and checkpoint write (see :mod:`zbrl.launch.stop_grace`)."""
        override = self.cfg.launch.stop_grace_s
        return stop_grace_s(override, self.monitor.measured(), self._weights_bytes)

    # -- evaluation ------------------------------------------------------------------------------

    def _evaluate_when_due(self) -> None:
        import ray

        if self._eval_ref is not None and ray.wait([self._eval_ref[1]], timeout=0)[0]:
            self._collect_eval(timeout=None)
        step = self.monitor.latest_step
        due = self._next_eval is not None and step >= self._next_eval and self._running
        if due and self._stop_deadline is None and self._eval_ref is None:
            if self.workers.evaluator is not None:
                self._eval_ref = (step, self.workers.evaluator.evaluate.remote(step, step))
            self._next_eval = step + self.cfg.eval.interval

    def _collect_eval(self, timeout: float | None) -> None:
        step, ref = self._eval_ref
        self._eval_ref = None
        kind, value = outcome_of(ref, "evaluator", timeout=timeout)
        if kind == "ok":
            self.monitor.record_eval(step, value)
            return
        self.outcome.evaluator_failures += 1
        print(
            f"[zbrl] warning: the evaluation at step {step} failed ({value}); training goes on, "
            "and a new evaluator takes the next one",
            file=sys.stderr,
            flush=True,
        )
        self.replace_evaluator()

    def replace_evaluator(self) -> None:
        import ray

        old = self.workers.evaluator
        if old is not None:
            self.workers.names.pop(old, None)
            ray.kill(old, no_restart=True)
        new = self.spawner.evaluator()
        self.workers.evaluator = new
        if new is not None:
            self.workers.names[new] = "evaluator"
