"""Every replacement of a Ray internal that zbrl makes, in one list (:data:`REPLACEMENTS`), and
the switch between Ray as it ships and Ray as zbrl tunes it (``launch.local_ray``).

- ``plain``: Ray exactly as it ships, through its public settings only: no replacement, no
  agent stand-in, no fork server. A run given a cluster address always gets it.
- ``fast``: a local Ray with every replacement below (each shortens the start of a run on a
  laptop-sized machine; docs/local-ray.md has the figures). The default for a local Ray whose
  version is inside :data:`TESTED_RAY`.

Each entry says what it replaces, why, what it saves, the Ray versions (major.minor) its
``canary`` passed on, and when it can be removed. ``canary()`` looks at the installed Ray (no
fake) and says why the replacement no longer applies (None: it does);
tests/unit/test_local_ray_canary.py runs every canary, and
``python -m zbrl.launch.local_ray.registry`` prints them for whatever Ray is installed.

This module imports neither Ray nor torch at import time.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import inspect
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from zbrl.launch.local_ray import replacements

LocalRayMode = Literal["fast", "plain"]
FAST: LocalRayMode = "fast"
PLAIN: LocalRayMode = "plain"

TESTED_RAY = ("2.10", "2.60")
"""The oldest and the newest Ray (major.minor) a run was tested on; pyproject's range is this."""


@dataclass(frozen=True)
class Replacement:
    """One replacement of a Ray internal (see the module docstring)."""

    name: str
    replaces: str
    """The Ray name (or program) it stands in for."""
    why: str
    saves: str
    """What a run gains, as measured (docs/local-ray.md)."""
    checked_on: tuple[str, ...]
    """Ray versions (major.minor) of :data:`ALL_CHECKED` on which its canary passed; on the
    others it is left out (Ray runs as it ships there)."""
    remove_when: str
    canary: Callable[[], str | None]
    apply: Callable[[], contextlib.AbstractContextManager[bool]] | None
    """Puts it in place while a local ``ray.init`` runs; None for the fork server, which
    :func:`zbrl.launch.ray_setup.start_local_ray` starts itself (it is a process)."""


def _ray_dir() -> str | None:
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def _services() -> Any:
    from ray._private import services

    return services


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def _source_has(function: Any, text: str) -> bool:
    try:
        return text in inspect.getsource(function)
    except (OSError, TypeError):
        return False


def _canary_console_popen() -> str | None:
    popen = getattr(_services(), "ConsolePopen", None)
    if not (isinstance(popen, type) and issubclass(popen, subprocess.Popen)):
        return "ray._private.services.ConsolePopen is missing or not a subprocess.Popen"
    return None


def _canary_lean_head() -> str | None:
    from ray._private.node import Node

    missing = [
        n for n in ("start_api_server", "start_monitor") if not callable(getattr(Node, n, None))
    ]
    return f"ray._private.node.Node has no {', '.join(missing)}" if missing else None


def _canary_startup_concurrency() -> str | None:
    services = _services()
    start = getattr(services, "start_ray_process", None)
    if start is None or _parameters(start)[:2] != ["command", "process_type"]:
        return "ray._private.services.start_ray_process(command, process_type, ...) changed"
    if not _source_has(services.start_raylet, "--maximum_startup_concurrency="):
        return "start_raylet no longer passes --maximum_startup_concurrency= to the raylet"
    return None


def _canary_worker_setup() -> str | None:
    services = _services()
    start = getattr(services, "start_raylet", None)
    if start is None or "setup_worker_path" not in _parameters(start):
        return "ray._private.services.start_raylet takes no setup_worker_path"
    folder = _ray_dir() or ""
    if not os.path.exists(os.path.join(folder, "_private", "workers", "setup_worker.py")):
        return "ray/_private/workers/setup_worker.py (handed anything unknown) is missing"
    from ray._private.runtime_env.context import RuntimeEnvContext

    from zbrl.launch.local_ray.worker_exec import KNOWN_CONTEXT

    fields = set(_parameters(RuntimeEnvContext.__init__)) - {"self"}
    if fields - KNOWN_CONTEXT:
        unknown = sorted(fields - KNOWN_CONTEXT)
        return f"RuntimeEnvContext has fields worker_exec does not know: {unknown}"
    return None


def _canary_dashboard_check() -> str | None:
    from ray._private import utils

    check = getattr(utils, "get_dashboard_dependency_error", None)
    if check is None or _parameters(check):
        return "ray._private.utils.get_dashboard_dependency_error() is missing or takes arguments"
    if not os.path.exists(os.path.join(_ray_dir() or "", "dashboard", "optional_deps.py")):
        return "ray/dashboard/optional_deps.py (the dashboard's package list) is missing"
    return None


def _canary_agent_standin() -> str | None:
    try:
        from ray._raylet import (  # noqa: F401
            DASHBOARD_AGENT_LISTEN_PORT_NAME,
            METRICS_AGENT_PORT_NAME,
            METRICS_EXPORT_PORT_NAME,
            get_port_filename,
        )
    except ImportError as error:
        return f"ray._raylet lacks the agent's port-file names ({error})"
    if not _source_has(_services().start_raylet, replacements.DASHBOARD_AGENT_FLAG):
        return f"start_raylet no longer passes {replacements.DASHBOARD_AGENT_FLAG} to the raylet"
    return _canary_startup_concurrency()


def _canary_fork_server() -> str | None:
    folder = _ray_dir() or ""
    if not os.path.exists(os.path.join(folder, "_private", "workers", "default_worker.py")):
        return "ray/_private/workers/default_worker.py (run in the forked child) is missing"
    from ray._private import ray_constants

    from zbrl.launch.local_ray.forkserver import RAYLET_PID_ENV

    if not _source_has(ray_constants, RAYLET_PID_ENV):
        return f"the raylet no longer sets {RAYLET_PID_ENV} for its workers"
    return _canary_worker_setup()  # the server is reached through worker_exec


ALL_CHECKED = ("2.10", "2.50", "2.60")
"""The Ray versions the canaries were run on (each entry: those it passed on)."""

REPLACEMENTS: tuple[Replacement, ...] = (
    Replacement(
        name="own_session",
        replaces="ray._private.services.ConsolePopen",
        why="Ray's processes start in a session of their own, so that a SIGTERM sent to the "
        "run's process group (timeout, kill -- -PGID, job control) reaches the driver alone, "
        "which stops the run cleanly with a checkpoint",
        saves="a run stopped by a group signal: without it, the GCS and workers die first and "
        "the driver exits 1 with no checkpoint",
        checked_on=ALL_CHECKED,
        remove_when="Ray's ray.init starts its processes with start_new_session (or an option "
        "for it)",
        canary=_canary_console_popen,
        apply=replacements.ray_in_own_session,
    ),
    Replacement(
        name="lean_head",
        replaces="ray._private.node.Node.start_api_server, Node.start_monitor",
        why="a local run of fixed size needs neither the API server (no job submission, no "
        "state API) nor the autoscaler's monitor; ray.init waits for the API server to start",
        saves="two Python processes at the start; about 1 s of ray.init on two busy cores",
        checked_on=ALL_CHECKED,
        remove_when="ray.init can leave them out through a public option",
        canary=_canary_lean_head,
        apply=replacements.lean_local_head,
    ),
    Replacement(
        name="startup_concurrency",
        replaces="ray._private.services.start_ray_process (raylet --maximum_startup_concurrency)",
        why="Ray lets a raylet start min(cores, num_cpus) workers at once: on two cores the "
        "consumer, whose imports are the longest, started only after two others registered",
        saves="the run's five actors start together (the consumer no longer queues)",
        checked_on=ALL_CHECKED,
        remove_when="Ray exposes the raylet's worker start-up concurrency as a setting",
        canary=_canary_startup_concurrency,
        apply=replacements.workers_start_at_once,
    ),
    Replacement(
        name="worker_setup",
        replaces="ray/_private/workers/setup_worker.py (start_raylet's setup_worker_path)",
        why="Ray's worker setup program imports Ray only to apply the runtime environment and "
        "exec default_worker.py, which imports Ray again; worker_exec.py does it with the "
        "standard library and is where a worker is handed to the fork server",
        saves="about 0.16 CPU-s per worker",
        checked_on=("2.50", "2.60"),
        remove_when="Ray's setup_worker.py stops importing Ray, and the fork server is gone",
        canary=_canary_worker_setup,
        apply=replacements.light_worker_setup,
    ),
    Replacement(
        name="dashboard_check",
        replaces="ray._private.utils.get_dashboard_dependency_error",
        why="Ray imports every dashboard package to see which is missing (aiohttp first, "
        "0.3 s) just before the raylet starts; zbrl looks for each first without importing",
        saves="about 0.3 s of the driver's ray.init on the minimal install",
        checked_on=("2.50", "2.60"),
        remove_when="Ray's check uses importlib.util.find_spec",
        canary=_canary_dashboard_check,
        apply=replacements.quick_dashboard_check,
    ),
    Replacement(
        name="agent_standin",
        replaces="ray's dashboard agent --minimal (start_ray_process, raylet "
        "--dashboard_agent_command)",
        why="with Ray's minimal install the agent imports Ray only to write 'not in use' to "
        "three port files the raylet waits for; agent_standin.py writes them with the "
        "standard library",
        saves="about 0.5 CPU-s on the path of every start",
        checked_on=("2.60",),
        remove_when="the raylet stops waiting for an agent that has nothing to run",
        canary=_canary_agent_standin,
        apply=replacements.idle_agent_replaced,
    ),
    Replacement(
        name="fork_server",
        replaces="each Ray worker started as a fresh Python (default_worker.py)",
        why="every producer and consumer imports torch, transformers and zbrl (3.4 CPU-s each); "
        "forkserver.py imports them once while Ray starts, and forks each worker from it",
        saves="the largest part of the start on two cores (docs/local-ray.md)",
        checked_on=("2.50", "2.60"),
        remove_when="Ray offers forked or pre-imported workers (or zbrl's workers import little)",
        canary=_canary_fork_server,
        apply=None,
    ),
)
"""Every replacement of a Ray internal, in the order a start applies them."""


def by_name(name: str) -> Replacement:
    for entry in REPLACEMENTS:
        if entry.name == name:
            return entry
    raise KeyError(name)


def installed_ray_version() -> str | None:
    """The installed Ray's version, read without importing Ray (None: not installed)."""
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None


def _minor(version: str) -> tuple[int, int]:
    parts = [*version.split("."), "0"][:2]
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def in_tested_range(version: str | None) -> bool:
    """Whether Ray ``version`` lies within :data:`TESTED_RAY` (by major.minor)."""
    if version is None:
        return False
    return _minor(TESTED_RAY[0]) <= _minor(version) <= _minor(TESTED_RAY[1])


def resolve_mode(
    asked: LocalRayMode | None, cluster: bool, ray_version: str | None
) -> tuple[LocalRayMode, str]:
    """The mode a start uses and why: a cluster address is always ``plain``; otherwise what
    ``launch.local_ray`` asks, and when it asks nothing, ``fast`` inside :data:`TESTED_RAY` and
    ``plain`` outside it."""
    if cluster:
        return PLAIN, "a cluster address: Ray as it ships"
    if asked is not None:
        return asked, f"launch.local_ray={asked}"
    if in_tested_range(ray_version):
        return FAST, f"Ray {ray_version} is within the tested range {TESTED_RAY[0]}-{TESTED_RAY[1]}"
    return PLAIN, (
        f"Ray {ray_version} is outside the tested range {TESTED_RAY[0]}-{TESTED_RAY[1]}: "
        "Ray as it ships (launch.local_ray=fast to tune it anyway)"
    )


def use_fork_server(mode: LocalRayMode, asked: bool | None, cuda_visible: bool) -> bool:
    """Whether a local start forks its workers from the fork server: never in ``plain``; in
    ``fast`` as ``launch.fork_workers`` asks, and when it asks nothing, only where no CUDA GPU
    is visible (forking a process that imported torch has not been checked with CUDA:
    bench/gpu_check.py checks it)."""
    if mode == PLAIN:
        return False
    return (not cuda_visible) if asked is None else asked


@contextlib.contextmanager
def applied(mode: LocalRayMode) -> Iterator[dict[str, bool]]:
    """While inside, every replacement with an ``apply`` whose canary passes on the installed
    Ray is in place in ``fast`` mode (none in ``plain``); yields each one's name and whether it
    is in place."""
    active: dict[str, bool] = {}
    with contextlib.ExitStack() as stack:
        if mode == FAST:
            # every canary first, on Ray as it ships (two replacements wrap the same function)
            fitting = {e.name: applies(e.name) for e in REPLACEMENTS if e.apply is not None}
            for entry in REPLACEMENTS:
                if entry.apply is not None:
                    fits = fitting[entry.name]
                    active[entry.name] = fits and stack.enter_context(entry.apply())
        yield active


def applies(name: str) -> bool:
    """Whether replacement ``name``'s canary passes on the installed Ray."""
    try:
        return by_name(name).canary() is None
    except Exception:  # a name or module gone: it does not apply
        return False


def canary_report() -> list[tuple[str, str | None]]:
    """Each replacement's name and why it no longer applies to the installed Ray (None: it
    does); an error inside a canary counts as not applying."""
    out = []
    for entry in REPLACEMENTS:
        try:
            reason = entry.canary()
        except Exception as error:  # a name or module gone: the replacement does not apply
            reason = f"{type(error).__name__}: {error}"
        out.append((entry.name, reason))
    return out


if __name__ == "__main__":
    print(f"ray {installed_ray_version()}")
    for name, reason in canary_report():
        print(f"{name:20s} {'applies' if reason is None else 'NO: ' + reason}")
