"""Worker failures as clear messages: what a role's call returned (ok, failed, died), the cause in
one line, and which shared actor to blame when one died."""

from __future__ import annotations

from typing import Any

from zbrl.errors import RunError


class RunFailed(RunError):
    """A worker failed; the message names the worker and the cause."""


def outcome_of(ref: Any, name: str, timeout: float | None = None) -> tuple[str, Any]:
    """``("ok", value)``, ``("failed", message)`` (the task raised, or did not answer in
    ``timeout``) or ``("died", message)`` (the actor's process is gone)."""
    import ray

    try:
        return "ok", ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        return "failed", f"{name} did not answer within {timeout}s"
    except ray.exceptions.RayTaskError as exc:  # first: also an ActorDiedError the task raised
        return "failed", f"{name} failed: {_cause(exc)}"
    except ray.exceptions.RayActorError as exc:
        return "died", f"{name} died: {_cause(exc)}"


# the actors every worker calls: when one dies, the worker that called it next fails first
SHARED_ACTORS = (("buffer", "rollout buffer"), ("store", "weight store"), ("hub", "telemetry hub"))


def blame_shared_actor(
    workers: Any, exc: BaseException, timeout_s: float = 30.0
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
