"""The driver: builds everything from one RunConfig, places the workers on Ray, runs to the end,
turns any worker failure into a clear error, writes the run's summary, and shuts down cleanly."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zbrl.assembly.artifacts import Artifacts, prepare_artifacts
from zbrl.assembly.datasets import encode_prompts
from zbrl.assembly.settings import buffer_settings
from zbrl.config import RunConfig, resolved_yaml
from zbrl.errors import RunError
from zbrl.launch.monitor import RunMonitor
from zbrl.launch.placement import Placement, reserve
from zbrl.launch.preflight import preflight
from zbrl.launch.ray_setup import init_ray
from zbrl.launch.run_dir import claim_run_dir
from zbrl.telemetry.idle import percentile
from zbrl.telemetry.report import SUMMARY_FILE, render_report
from zbrl.transport.clients import BufferClient, HubClient
from zbrl.transport.handles import RayHandle
from zbrl.types import EncodedPrompt


class RunFailed(RunError):
    """A worker failed; the message names the worker and the cause."""


@dataclass
class Workers:
    """Handles of every actor of a run."""

    buffer: Any
    store: Any
    hub: Any
    producers: list[Any]
    consumers: list[Any]
    evaluator: Any | None
    names: dict[Any, str] = field(default_factory=dict)
    placement: Placement | None = None
    where: list[dict[str, Any]] = field(default_factory=list)  # summary.json "workers"

    def all(self) -> list[Any]:
        out = [*self.producers, *self.consumers, self.buffer, self.store, self.hub]
        return out + ([self.evaluator] if self.evaluator is not None else [])


def run_training(cfg: RunConfig) -> dict[str, Any]:
    """Run one RL job end to end; returns the summary (also written to RUN_DIR/summary.json) and
    ``run_dir``, the directory used (a fresh one when the configured one holds a finished run)."""
    from zbrl.assembly.models import quiet_transformers
    from zbrl.assembly.rewards import check_reward

    quiet_transformers()
    check_reward(cfg)  # a reward that cannot be built fails here, before any file or worker
    preflight(cfg)  # so does an unreachable address or a missing GPU
    with prepare_run_dir(cfg) as run_dir:
        print(f"[zbrl] run dir: {run_dir}", flush=True)
        summary = _train(cfg, run_dir)
    return {**summary, "run_dir": str(run_dir)}


def _train(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    artifacts = prepare_artifacts(cfg)
    train_prompts, eval_sets = encode_datasets(cfg, artifacts)
    total_steps = planned_steps(cfg, len(train_prompts))
    started_ray = init_ray(cfg)
    workers: Workers | None = None
    try:
        workers = create_workers(cfg, artifacts, run_dir, train_prompts, eval_sets, total_steps)
        wait_until_ready(cfg, workers)
        record_placement(cfg, workers, run_dir)
        monitor = RunMonitor(cfg, run_dir, HubClient(RayHandle(workers.hub)), total_steps)
        try:
            return execute(cfg, workers, monitor, run_dir)
        finally:
            monitor.close()
    except Exception as exc:
        blamed = blame_shared_actor(workers, exc) if workers is not None else None
        if blamed is not None:
            raise blamed from exc
        raise
    finally:
        shutdown(workers, started_ray)


@contextlib.contextmanager
def prepare_run_dir(cfg: RunConfig) -> Iterator[Path]:
    """The run's directory with its resolved config.yaml, locked while inside (see run_dir.py):
    ``cfg.run_dir``, or a fresh sibling when that holds a finished run; RunDirInUse when a live
    run holds it."""
    run_dir, lock = claim_run_dir(Path(cfg.run_dir))
    try:
        (run_dir / "config.yaml").write_text(resolved_yaml(cfg))
        yield run_dir
    finally:
        lock.release()


def encode_datasets(
    cfg: RunConfig, artifacts: Artifacts
) -> tuple[list[EncodedPrompt], dict[str, list[EncodedPrompt]]]:
    from zbrl.assembly.models import load_tokenizer

    tokenizer = load_tokenizer(cfg, artifacts.tokenizer_dir)
    train, stats = encode_prompts(artifacts.train_path, cfg, tokenizer, limit=cfg.data.max_prompts)
    print(
        f"[zbrl] train prompts: {len(train)} (dropped {stats['dropped']}, truncated "
        f"{stats['truncated']}, skipped lines {stats['skipped_lines']})",
        flush=True,
    )
    evals = {
        name: encode_prompts(path, cfg, tokenizer, limit=cfg.eval.max_prompts)[0]
        for name, path in artifacts.eval_paths.items()
    }
    return train, evals


def planned_steps(cfg: RunConfig, num_prompts: int) -> int:
    from_data = math.ceil(num_prompts * cfg.data.num_epochs / cfg.training.train_batch_size)
    if cfg.training.max_steps is None:
        return max(1, from_data)
    return max(1, min(cfg.training.max_steps, from_data))


def create_workers(
    cfg: RunConfig,
    artifacts: Artifacts,
    run_dir: Path,
    train_prompts: list[EncodedPrompt],
    eval_sets: dict[str, list[EncodedPrompt]],
    total_steps: int,
) -> Workers:
    import ray

    from zbrl.launch.workers import ConsumerWorker, EvaluatorWorker, ProducerWorker
    from zbrl.telemetry.hub import TelemetryHub
    from zbrl.transport.buffer import RolloutBuffer
    from zbrl.transport.weight_sync.object_store import WeightStore

    la = cfg.launch
    data = cfg.model_dump(mode="json")
    model_dir, tok_dir = str(artifacts.model_dir), str(artifacts.tokenizer_dir)
    place = reserve(cfg)  # placement groups first: a cluster that is too small fails here
    concurrency = 4 * (la.num_producers + la.num_consumers) + 8
    shared = {**place.shared_options(), "max_concurrency": concurrency}
    buffer = ray.remote(RolloutBuffer).options(**shared).remote(buffer_settings(cfg))
    store = ray.remote(WeightStore).options(**shared).remote()
    hub = ray.remote(TelemetryHub).options(**shared).remote()
    prompts_ref = ray.put(train_prompts)
    producers = [
        ray.remote(ProducerWorker)
        .options(**place.producer_options(i))
        .remote(data, i, model_dir, tok_dir, prompts_ref, buffer, store, hub)
        for i in range(la.num_producers)
    ]
    consumers = [
        ray.remote(ConsumerWorker)
        .options(**place.consumer_options(i))
        .remote(data, i, model_dir, tok_dir, str(run_dir), total_steps, buffer, store, hub)
        for i in range(la.num_consumers)
    ]
    evaluator = None
    if eval_sets:
        evaluator = (
            ray.remote(EvaluatorWorker)
            .options(**place.evaluator_options())
            .remote(data, model_dir, tok_dir, eval_sets, str(run_dir), store, hub)
        )
    workers = Workers(buffer, store, hub, producers, consumers, evaluator, placement=place)
    workers.names = {a: f"producer-{i}" for i, a in enumerate(producers)}
    workers.names.update({a: f"consumer-{i}" for i, a in enumerate(consumers)})
    if evaluator is not None:
        workers.names[evaluator] = "evaluator"
    return workers


def wait_until_ready(cfg: RunConfig, workers: Workers, timeout_s: float = 900.0) -> None:
    """Block until every worker finished building its state (models loaded), or fail clearly."""
    refs = {a.__ray_ready__.remote(): name for a, name in workers.names.items()}
    _wait_all(refs, timeout_s, what="start-up")


WORKERS_FILE = "workers.json"


def record_placement(cfg: RunConfig, workers: Workers, run_dir: Path) -> None:
    """Ask every worker where it runs; kept for summary.json and written to RUN_DIR/workers.json
    at once (so a running run shows where everything is)."""
    la = cfg.launch
    eval_gpus = workers.placement.evaluator_options()["num_gpus"] if workers.placement else 0
    resources = {
        "producer": (la.producer_num_cpus, la.producer_num_gpus),
        "consumer": (la.consumer_num_cpus, la.consumer_num_gpus),
        "evaluator": (0.0, float(eval_gpus)),
    }
    refs = {a.placement.remote(): name for a, name in workers.names.items()}
    where = []
    for ref, name in refs.items():
        role = name.split("-")[0]
        cpus, gpus = resources[role]
        info = _get(ref, name, timeout=60)
        where.append({"name": name, "role": role, **info, "num_cpus": cpus, "num_gpus": gpus})
    workers.where = sorted(where, key=lambda w: w["name"])
    (run_dir / WORKERS_FILE).write_text(json.dumps(workers.where, indent=2) + "\n")


def execute(cfg: RunConfig, workers: Workers, monitor: RunMonitor, run_dir: Path) -> dict:
    import ray

    initial = None
    if workers.evaluator is not None and cfg.eval.at_start:
        print("[zbrl] initial evaluation ...", flush=True)
        initial = _get(workers.evaluator.evaluate.remote(0, 0), "evaluator", timeout=1800)
        monitor.record_eval(0, initial)
    start = time.time()
    monitor.window_start = start
    running = {c.run.remote(): workers.names[c] for c in workers.consumers}
    running.update({p.run.remote(): workers.names[p] for p in workers.producers})
    results: dict[str, Any] = {}
    eval_ref, next_eval = None, cfg.eval.interval or None
    while running:
        ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
        for ref in ready:
            name = running.pop(ref)
            results[name] = _get(ref, name)
        monitor.poll()
        if eval_ref is not None and ray.wait([eval_ref], timeout=0)[0]:
            step = monitor.latest_step
            monitor.record_eval(step, _get(eval_ref, "evaluator"))
            eval_ref = None
        due = next_eval is not None and monitor.latest_step >= next_eval and running
        if due and workers.evaluator is not None and eval_ref is None:
            step = monitor.latest_step
            eval_ref = workers.evaluator.evaluate.remote(step, step)
            next_eval = step + cfg.eval.interval
    end = time.time()
    if eval_ref is not None:
        monitor.record_eval(monitor.latest_step, _get(eval_ref, "evaluator", timeout=1800))
    steps = max((r.steps for n, r in results.items() if n.startswith("consumer")), default=0)
    final = None
    if workers.evaluator is not None:
        print("[zbrl] final evaluation ...", flush=True)
        final = _get(workers.evaluator.evaluate.remote(steps, steps), "evaluator", timeout=1800)
        monitor.record_eval(steps, final)
    monitor.poll()
    buffer_stats = BufferClient(RayHandle(workers.buffer)).snapshot()
    summary = build_summary(monitor, results, buffer_stats, start, end, steps, initial, final)
    summary["workers"] = workers.where
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print(render_report(run_dir), flush=True)
    return summary


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
    idle = monitor.idle_fractions(end)
    latencies = [
        lat
        for n, r in results.items()
        if n.startswith("producer")
        for lat in r.weight_sync_latencies_s
    ]
    staleness = [
        m["staleness_mean"] for m in monitor.step_metrics.values() if "staleness_mean" in m
    ]
    return {
        "wall_s": end - start,
        "steps": steps,
        "eval_accuracy_initial": _primary_accuracy(initial),
        "eval_accuracy_final": _primary_accuracy(final),
        "producer_idle_frac": idle.get("producer"),
        "consumer_idle_frac": idle.get("consumer"),
        "mean_staleness": sum(staleness) / len(staleness) if staleness else 0.0,
        "weight_sync_latency_p50_s": percentile(latencies, 50) if latencies else None,
        "weight_sync_latency_p95_s": percentile(latencies, 95) if latencies else None,
        "samples_trained": int(buffer_stats["samples_trained"]),
        "samples_generated": int(buffer_stats["samples_generated"]),
        "sample_utilization": buffer_stats["sample_utilization"],
        "groups_filtered": int(
            buffer_stats["groups_filtered_accuracy"] + buffer_stats["groups_filtered_truncated"]
        ),
        "partial_batches": int(buffer_stats["partial_batches"]),
        "eval_initial": initial,
        "eval_final": final,
    }


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


# the actors every worker calls: when one dies, the worker that called it next fails first
SHARED_ACTORS = (("buffer", "rollout buffer"), ("store", "weight store"), ("hub", "telemetry hub"))


def blame_shared_actor(
    workers: Workers, exc: BaseException, timeout_s: float = 30.0
) -> RunFailed | None:
    """When the run failed with a worker error (or a Ray error from the hub), an error that names
    the shared actors that are dead, with ``exc`` as their consequence; None when all live."""
    import ray

    if not isinstance(exc, RunFailed | ray.exceptions.RayError):
        return None
    dead = []
    for attr, label in SHARED_ACTORS:
        try:
            ray.get(getattr(workers, attr).__ray_ready__.remote(), timeout=timeout_s)
        except ray.exceptions.ActorDiedError as err:
            dead.append(f"the {label} actor died ({_death_cause(err)})")
        except ray.exceptions.RayError:
            pass  # busy, unreachable for a moment, or Ray itself going down: not known dead
    if not dead:
        return None
    consequence = str(exc) if isinstance(exc, RunFailed) else _cause(exc)
    return RunFailed(f"{'; '.join(dead)}; as a consequence: {consequence}")


def _death_cause(err: BaseException) -> str:
    """The lines of an ActorDiedError that say why (not its header nor the tab-indented ids)."""
    lines = [x.strip() for x in str(err).splitlines() if x.strip() and not x.startswith("\t")]
    why = [x for x in lines if not x.startswith("The actor died unexpectedly before finishing")]
    text = " ".join(why) or "no cause given"
    return text.split(" Some common causes include")[0]  # Ray's general advice, not the cause


def _primary_accuracy(results: dict | None) -> float | None:
    if not results:
        return None
    return next(iter(results.values())).get("accuracy")


def _get(ref: Any, name: str, timeout: float | None = None) -> Any:
    import ray

    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise RunFailed(f"{name} did not answer within {timeout}s") from None
    except ray.exceptions.RayTaskError as exc:  # first: also an ActorDiedError the task raised
        raise RunFailed(f"{name} failed: {_cause(exc)}") from None
    except ray.exceptions.RayActorError as exc:
        raise RunFailed(f"{name} died: {_cause(exc)}") from None


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


def _cause(exc: BaseException) -> str:
    import ray

    cause = getattr(exc, "cause", None)
    if isinstance(cause, ray.exceptions.RayActorError):  # a call to another actor: which one
        lines = str(cause).strip().splitlines()
        ids = [x.strip() for x in lines[1:] if x.strip().startswith(("class_name:", "pid:"))]
        return f"{type(cause).__name__}: {lines[0] if lines else ''} ({', '.join(ids)})"
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__
