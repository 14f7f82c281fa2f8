"""The context managers that replace Ray internals while a local ``ray.init`` starts Ray
(``launch.local_ray=fast``); :mod:`zbrl.launch.local_ray.registry` lists them with what each
replaces, why, what it saves, the Ray versions it was checked on and when it can go.

Each yields True while its replacement is in place, and False (changing nothing) when the
installed Ray has no such name or a different shape: an unknown Ray runs as it ships. The
canary test (tests/unit/test_local_ray_canary.py) fails instead, so that a Ray that no longer
fits is noticed.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

from zbrl.launch.local_ray import agent_standin


@contextlib.contextmanager
def _replaced_in_services(name: str, replace: Callable[[Any], Any]) -> Iterator[bool]:
    """While inside, ``ray._private.services.<name>`` is ``replace(original)``; yields False
    (and changes nothing) when this Ray version has no such attribute or ``replace`` gives
    None (it does not know the original)."""
    try:
        from ray._private import services
    except ImportError:
        yield False
        return
    original = getattr(services, name, None)
    replacement = None if original is None else replace(original)
    if replacement is None:
        yield False
        return
    with _replaced_attribute(services, name, replacement):
        yield True


def _command_argument_rewritten(
    flag: str, rewrite: Callable[[str], str]
) -> contextlib.AbstractContextManager[bool]:
    """While inside, each process Ray starts whose command line has an argument ``flag<value>``
    gets ``flag<rewrite(value)>`` instead; yields False (and changes nothing) when this Ray
    version has no ``ray._private.services.start_ray_process``."""

    def replace(original: Any) -> Any:
        def start_ray_process(command: list[str], *args: Any, **kwargs: Any) -> Any:
            command = [
                f"{flag}{rewrite(c[len(flag) :])}" if c.startswith(flag) else c for c in command
            ]
            return original(command, *args, **kwargs)

        return start_ray_process

    return _replaced_in_services("start_ray_process", replace)


def ray_in_own_session() -> contextlib.AbstractContextManager[bool]:
    """While inside, Ray starts its processes in a new session; yields False (and changes
    nothing) when this Ray version has no ``ray._private.services.ConsolePopen`` to wrap.

    ``timeout``, ``kill -- -PGID``, a shell's job control and batch schedulers send SIGTERM to
    every process of the run's process group. A local ``ray.init`` starts its GCS server,
    raylet and helpers as children of the driver, in the driver's group, so such a SIGTERM
    killed the GCS and every worker while the driver began its clean stop (it then waited for
    the dead GCS and exited 1 with no checkpoint). Started with ``setsid``, they are out of the
    group: the signal reaches only the driver, which stops the run cleanly
    (:mod:`zbrl.launch.signals`) and ends Ray. Ray still ties each process to the driver's life
    (Linux's parent-death signal). A signal sent to every process of a job one by one (systemd's
    ``KillMode=control-group``, Slurm's job-step kill) still reaches the workers
    (docs/survival.md)."""

    def replace(original: Any) -> Any:
        class OwnSessionPopen(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("start_new_session", True)
                super().__init__(*args, **kwargs)

        return OwnSessionPopen

    return _replaced_in_services("ConsolePopen", replace)


@contextlib.contextmanager
def lean_local_head() -> Iterator[bool]:
    """While inside, a local ``ray.init`` starts neither the API server nor the autoscaler's
    monitor; yields False (and changes nothing) when this Ray version's ``Node`` lacks them.

    With ``include_dashboard=False`` the API server loads only the usage-stats module (and zbrl
    turns usage stats off), yet ``ray.init`` waits for it to start, about a second on two busy
    cores; the monitor autoscales, which a local run of fixed size never does. Neither is needed
    by zbrl (no job submission, no state API, no ``ray status``); each is one more Python
    process starting beside the run (docs/performance.md, Start-up). A cluster given by address
    (``ray start`` on each node) keeps its own."""
    try:
        from ray._private.node import Node
    except ImportError:
        yield False
        return
    names = ("start_api_server", "start_monitor")
    if not all(callable(getattr(Node, n, None)) for n in names):
        yield False
        return
    saved = {n: Node.__dict__[n] for n in names if n in Node.__dict__}

    def skip(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    for n in names:
        setattr(Node, n, skip)
    try:
        yield True
    finally:
        for n in names:
            if n in saved:
                setattr(Node, n, saved[n])
            else:
                delattr(Node, n)


WORKER_STARTS_AT_ONCE = 8
"""How many worker processes a local raylet may start at the same time (see below)."""


def workers_start_at_once(
    limit: int = WORKER_STARTS_AT_ONCE,
) -> contextlib.AbstractContextManager[bool]:
    """While inside, a local raylet may start ``limit`` worker processes at once instead of
    ``min(cores, num_cpus)``; yields False (and changes nothing) when this Ray version starts
    its raylet otherwise.

    A run asks for five actors at its start (telemetry hub, rollout buffer, weight store,
    producer, consumer) and Ray started two at a time on two cores: the consumer's process
    began only once two others had registered, although its imports are the longest part of
    the start (docs/performance.md, Start-up). Started together, the processes share the cores
    from the first moment; the CPU they need is the same."""
    return _command_argument_rewritten(
        "--maximum_startup_concurrency=", lambda value: str(max(limit, int(value)))
    )


def light_worker_setup() -> contextlib.AbstractContextManager[bool]:
    """While inside, a local raylet starts each Python worker through
    :mod:`zbrl.launch.local_ray.worker_exec` instead of Ray's ``setup_worker.py``; yields False (and
    changes nothing) when this Ray version's ``start_raylet`` takes no ``setup_worker_path``.

    Ray's program imports Ray (0.55 CPU-s) only to apply the runtime environment's context and
    hand over to ``default_worker.py``, which imports Ray again; zbrl's does the same with the
    standard library, and hands anything it does not know back to Ray's (docs/performance.md,
    Start-up)."""

    def replace(original: Any) -> Any:
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            return None
        if "setup_worker_path" not in signature.parameters:
            return None
        from zbrl.launch.local_ray import worker_exec

        def start_raylet(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.arguments["setup_worker_path"] = worker_exec.__file__
            return original(*bound.args, **bound.kwargs)

        return start_raylet

    return _replaced_in_services("start_raylet", replace)


DASHBOARD_AGENT_FLAG = "--dashboard_agent_command="
"""The raylet's argument that carries the dashboard agent's command line."""


def idle_agent_replaced() -> contextlib.AbstractContextManager[bool]:
    """While inside, a local raylet whose dashboard agent would run ``--minimal`` (Ray's minimal
    install: no dashboard modules to load) starts :mod:`zbrl.launch.local_ray.agent_standin` in its
    place; yields False (and changes nothing) when this Ray version does not say where the
    agent's port files go.

    That agent imports Ray only to write "not in use" to its three port files and watch the
    raylet, and the raylet waits for those files before it registers: 0.5 CPU-s of the run's
    start, on the path of every run (docs/performance.md, Start-up). The stand-in writes the
    same files and watches the raylet with the standard library. An agent with modules (Ray
    installed with its dashboard, ``ray[default]``) is left as it is."""
    try:
        from ray._raylet import (
            DASHBOARD_AGENT_LISTEN_PORT_NAME,
            METRICS_AGENT_PORT_NAME,
            METRICS_EXPORT_PORT_NAME,
            get_port_filename,
        )
    except ImportError:
        return contextlib.nullcontext(False)
    names = (METRICS_AGENT_PORT_NAME, METRICS_EXPORT_PORT_NAME, DASHBOARD_AGENT_LISTEN_PORT_NAME)

    def stand_in(agent_command: str) -> str:
        args = shlex.split(agent_command)
        given = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        if "--minimal" not in args or "node-id" not in given or "session-dir" not in given:
            return agent_command
        files = [
            os.path.join(given["session-dir"], get_port_filename(given["node-id"], name))
            for name in names
        ]
        # quoted as Ray quotes the agent's command for the raylet
        return subprocess.list2cmdline([sys.executable, "-S", agent_standin.__file__, *files])

    return _command_argument_rewritten(DASHBOARD_AGENT_FLAG, stand_in)


def quick_dashboard_check() -> contextlib.AbstractContextManager[bool]:
    """While inside, Ray's test of whether its dashboard's packages are installed (which decides
    whether the dashboard agent runs ``--minimal``) first looks for each package without
    importing any; yields False (and changes nothing) when this Ray version has no such test.

    Ray's test imports them all and sees which import fails: on the minimal install, ``aiohttp``
    (0.3 s) is imported before ``aiohttp_cors`` is found missing, in the driver, just before the
    raylet starts. The packages are read from Ray's own list (``ray/dashboard/optional_deps.py``);
    when every one of them is there, Ray's test runs as it is."""
    try:
        import ray
        from ray._private import utils
    except ImportError:
        return contextlib.nullcontext(False)
    original = getattr(utils, "get_dashboard_dependency_error", None)
    listing = os.path.join(os.path.dirname(ray.__file__), "dashboard", "optional_deps.py")
    if original is None or not os.path.exists(listing):
        return contextlib.nullcontext(False)

    def dependency_error() -> ImportError | None:
        for name in imported_packages(listing):
            if importlib.util.find_spec(name) is None:
                return ImportError(f"No module named {name!r}", name=name)
        return original()

    return _replaced_attribute(utils, "get_dashboard_dependency_error", dependency_error)


def imported_packages(path: str) -> list[str]:
    """The top-level packages the Python file ``path`` imports, in order, once each."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [node.module]
        else:
            continue
        names += [n.split(".")[0] for n in found]
    return list(dict.fromkeys(names))


@contextlib.contextmanager
def _replaced_attribute(owner: Any, name: str, value: Any) -> Iterator[bool]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield True
    finally:
        setattr(owner, name, saved)
