"""Starting Ray: a local cluster on loopback only (docs/cluster.md), or an existing cluster.

A local Ray binds every listening socket (GCS, raylet node manager and object manager, runtime-env
agent, the gRPC server of the driver and of every worker) to the node IP address it was started
with, but ``ray.init(_node_ip_address="127.0.0.1")`` replaces a loopback address by the machine's
external one unless ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` is false. Ray sets that
constant from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when ``ray`` is first imported, so setting the
variable later (or not at all) is not enough: :func:`loopback_only` sets both, whatever imported
``ray`` first, and puts them back after ``ray.init``. The processes Ray starts get their node IP
address on their command line and the variable through the environment they inherit.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from zbrl.config import RunConfig
from zbrl.errors import RunError
from zbrl.launch.local_ray import registry
from zbrl.launch.local_ray.forkserver import start_fork_server

LOOPBACK = "127.0.0.1"
# Read by Ray: the first at import (ray_constants.ENABLE_RAY_CLUSTER), the second by ray.init.
NO_PRESTART = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
"""Ray's settings for a local head with a fork server: no worker started ahead of need. Ray
starts a worker per CPU when the driver connects, and the driver's ``ray.init`` waits until
they have registered (0.8 s on two cores, 2-3 s while the fork server imports); a forked worker
starts in half a second when asked for, so the head does without them."""
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While inside: a local ``ray.init`` keeps 127.0.0.1 as the node IP address (see above).

    Afterwards the environment and Ray's constant are as the process had them, so a later
    ``ray.init(address=...)`` to a cluster in the same process behaves as without zbrl.
    """
    saved = {key: os.environ.get(key) for key in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    from ray._private import ray_constants  # a first import here reads the variable just set

    ray_constants.ENABLE_RAY_CLUSTER = False  # ray may have been imported before, with it unset
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(
            ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, not ray_constants.IS_WINDOWS_OR_OSX
        )


TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
TOKEN_AUTH_NOTICE = "RAY_AUTH_MODE=disabled to opt out"
"""Ray's notice, on every new local cluster it starts with token authentication on by
default, that it did so (Ray 2.5x and later)."""


class _DropTokenAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return TOKEN_AUTH_NOTICE not in record.getMessage()


@contextlib.contextmanager
def quiet_token_auth_notice() -> Iterator[None]:
    """While inside, Ray's notice that a new local cluster has token authentication (Ray's
    default, kept) is not printed: on a local run on loopback it tells the user nothing to
    act on. Every other record of that logger, and of Ray, passes as before."""
    logger = logging.getLogger(TOKEN_AUTH_LOGGER)
    dropping = _DropTokenAuthNotice()
    logger.addFilter(dropping)
    try:
        yield
    finally:
        logger.removeFilter(dropping)


def required_cpus(cfg: RunConfig) -> float:
    """The CPUs the run's workers reserve: producers, consumers and reward workers."""
    from zbrl.launch.placement import reward_worker_count, reward_worker_resources

    la = cfg.launch
    cpus = la.num_producers * la.producer_num_cpus + la.num_consumers * la.consumer_num_cpus
    workers = reward_worker_count(cfg)
    if workers:
        cpus += workers * reward_worker_resources(cfg)[0]
    return cpus


def init_ray(cfg: RunConfig) -> bool:
    """Start or connect to Ray; returns True when this call started it (and must shut it down).
    The driver calls it from a background thread (:class:`RayStart`). A cluster address gets Ray
    as it ships; a local Ray starts in the mode ``launch.local_ray`` resolves to
    (:func:`zbrl.launch.local_ray.registry.resolve_mode`)."""
    address = cfg.launch.ray_address or os.environ.get("RAY_ADDRESS")
    if address:  # a cluster: its own addresses and ports, nothing forced here
        import ray

        if ray.is_initialized():
            return False
        ray.init(address=address, log_to_driver=True)
        return True
    if _ray_running():  # the caller's own ray.init (a test session's Ray, say): used as it is
        return False
    mode, why = registry.resolve_mode(
        cfg.launch.local_ray, cluster=False, ray_version=registry.installed_ray_version()
    )
    if cfg.launch.local_ray is None and mode == registry.PLAIN:
        print(f"[zbrl] local Ray: plain ({why})", file=sys.stderr, flush=True)
    start_local_ray(
        max(2, math.ceil(required_cpus(cfg)) + 1), mode=mode, fork_workers=cfg.launch.fork_workers
    )
    return True


def start_local_ray(
    num_cpus: int, mode: registry.LocalRayMode = registry.FAST, fork_workers: bool | None = None
) -> None:
    """Start a new local Ray instance with ``num_cpus`` CPUs (no GPU unless CUDA is there), every
    socket on loopback; raises RunError if Ray picked another address anyway. ``mode``: ``fast``
    puts every replacement of :data:`zbrl.launch.local_ray.registry.REPLACEMENTS` in place,
    ``plain`` none; ``fork_workers``: ``launch.fork_workers``
    (:func:`zbrl.launch.local_ray.registry.use_fork_server` decides)."""
    cuda = _has_cuda()
    num_gpus = 0 if not cuda else None
    # first, even before Ray is imported, so that its imports run while Ray starts (the
    # variables set for Ray below are Ray's, which the server lets differ)
    forking = registry.use_fork_server(mode, fork_workers, cuda_visible=cuda)
    server = start_fork_server() if forking else None
    with loopback_only(), quiet_token_auth_notice():
        if server is not None and not registry.applies("fork_server"):
            server.stop()  # this Ray's workers would never reach it
            server = None
        try:
            with (
                registry.applied(mode),
                server.advertised() if server is not None else contextlib.nullcontext(),
            ):
                import ray

                # address "local": a new local instance, never a `ray start` cluster on disk
                ray.init(
                    address="local", num_cpus=num_cpus, num_gpus=num_gpus,
                    _node_ip_address=LOOPBACK, include_dashboard=False, dashboard_host=LOOPBACK,
                    log_to_driver=True, logging_level="WARNING",
                    _system_config=NO_PRESTART if server is not None else None,
                )  # fmt: skip
        except BaseException:
            if server is not None:
                server.stop()
            raise
    raylet = _raylet_pid() if server is not None else None
    if server is not None and raylet is not None:
        # it ends with the raylet; otherwise (not told) with this process. Told from a thread:
        # it answers once its imports are done (seconds), which the run need not wait for
        threading.Thread(
            target=server.follow, args=(raylet,), name="zbrl-forkserver-follow", daemon=True
        ).start()
    node_ip = ray.util.get_node_ip_address()
    if node_ip != LOOPBACK:
        ray.shutdown()
        raise RunError(
            f"the local Ray started on {node_ip} instead of {LOOPBACK}; a local run listens on "
            "loopback only (docs/cluster.md)"
        )


def _raylet_pid() -> int | None:
    """The pid of the raylet this process's ``ray.init`` started (None if Ray does not say)."""
    try:
        from ray._private import ray_constants
        from ray._private.worker import _global_node

        infos = _global_node.all_processes[ray_constants.PROCESS_TYPE_RAYLET]
        return int(infos[0].process.pid)
    except (ImportError, AttributeError, KeyError, IndexError, TypeError):
        return None


def _ray_running() -> bool:
    ray = sys.modules.get("ray")  # not imported: not running (and not imported here, see above)
    return ray is not None and ray.is_initialized()


def _has_cuda() -> bool:
    """Whether torch sees a CUDA GPU; a CPU build of torch is recognised without importing it
    (a second or more that Ray's start need not wait for)."""
    if _torch_cuda_version() is None:
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _torch_cuda_version() -> str | None:
    """The CUDA version torch was built for, read from ``torch/version.py`` (None: a CPU build,
    or torch missing); ``"unknown"`` when that file does not say."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return "unknown"
    found = re.search(r"^cuda\b[^=]*=\s*(.+?)\s*$", text, re.MULTILINE)
    if found is None:
        return "unknown"
    value = found.group(1).strip("'\"")
    return None if value == "None" else value


T = TypeVar("T")


class RayStart(Generic[T]):
    """Ray starting in a background thread (``start``: :func:`init_ray` for the run, and what
    needs nothing but Ray), so that it starts while the driver prepares the run's inputs
    (docs/performance.md, Start-up).

    :meth:`result` waits for it and returns what ``start`` returned or raises what it raised. A
    start that fails before it takes the result calls :meth:`abandon`, which waits for the
    thread and undoes what it did (``stop``: shut down the Ray it started, say).
    ``seconds`` is how long Ray took to start. What Ray logs from that thread meanwhile (its
    notice about token authentication, say) is held and printed when the run takes Ray, so that
    a start that fails on its inputs still prints one ``error:`` line and nothing else.

    The thread lives until :meth:`release` (after ``ray.shutdown``): Ray ties the processes it
    starts (GCS, raylet) to the life of the *thread* that started them (Linux's parent-death
    signal fires when that thread ends), so a thread that ended after ``ray.init`` would take
    the local cluster with it."""

    def __init__(self, start: Callable[[], T], stop: Callable[[T], None]) -> None:
        self._start = start
        self._stop = stop
        self._value: T | None = None
        self._error: BaseException | None = None
        self._taken = False
        self._ready = threading.Event()
        self._released = threading.Event()
        self._held = _HeldRecords()
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, name="ray-start", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import time

        began = time.time()
        try:
            with self._held.holding():
                self._value = self._start()
        except BaseException as exc:  # handed to the main thread by result()
            self._error = exc
        finally:
            self.seconds = time.time() - began
            self._ready.set()
        self._released.wait()  # the parent of Ray's processes: see the class docstring

    def result(self) -> T:
        self._taken = True
        self._ready.wait()
        self._held.emit()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def release(self) -> None:
        """Ray is shut down (or was not started here): the thread may end."""
        self._released.set()

    def abandon(self) -> None:
        """After a failed start: wait for Ray's start and undo it (a failure to start Ray is
        then beside the point: the start's own error is the one reported)."""
        if self._taken:
            return
        self._taken = True
        self._ready.wait()
        try:
            if self._error is None:
                self._stop(self._value)  # type: ignore[arg-type]
        finally:
            self.release()


class _HeldRecords(logging.Filter):
    """While :meth:`holding`, the records Ray logs from this thread are kept instead of printed,
    for :meth:`emit` to print later. Ray's warning that ``ray.init`` outside the main thread
    sets no SIGTERM handler is dropped: the driver installs its own right after
    (:class:`zbrl.launch.signals.StopSignals`)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread:
            return True
        if "SIGTERM handler is not set" not in record.getMessage():
            self.records.append(record)
        return False

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        import ray  # noqa: F401  (sets up Ray's log handlers, which this filters)

        self.thread = threading.get_ident()
        handlers = logging.getLogger("ray").handlers
        for handler in handlers:
            handler.addFilter(self)
        try:
            yield
        finally:
            for handler in handlers:
                handler.removeFilter(self)

    def emit(self) -> None:
        records, self.records = self.records, []
        for record in records:
            logging.getLogger(record.name).handle(record)
