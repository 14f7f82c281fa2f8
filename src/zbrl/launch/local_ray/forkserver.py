"""Ray's worker processes of a local run forked from one process that has already imported
what the heavy workers import (torch, transformers, zbrl's worker roles) and Ray itself.

Every worker of a run is a fresh Python, and the producer and the consumer import torch,
transformers and zbrl's training and rollout code (3.4 CPU-s each): on two cores, the largest
part of the time from ``zbrl train`` to its first step (docs/performance.md, Start-up). The
fork server imports them once, while Ray's own processes start (when the cores are half idle),
and each worker then begins as a copy of it: the modules are there, their memory shared until
written.

How a worker starts (``ray_setup.start_local_ray`` starts the server and puts
:mod:`zbrl.launch.local_ray.worker_exec` in the raylet's command):

1. The raylet starts ``python worker_exec.py default_worker.py ARGS`` as it would start Ray's
   ``setup_worker.py``. ``worker_exec`` applies the runtime environment's variables, then sends
   the server its arguments, environment, working directory, signal dispositions and its three
   standard streams (``SCM_RIGHTS``) over the server's Unix socket.
2. The server forks. The child starts a session (and process group) of its own, as the raylet
   gives each worker it starts (it ends a worker by signalling the worker's group). It takes
   the streams, the directory, the environment and the signals, and runs ``default_worker.py``
   as ``__main__``: from there it is an ordinary Ray worker, which registers with the raylet
   under its own pid (the raylet knows its workers by the pid they report, so ``ray.kill``,
   Ray's OOM killer and a test that kills a worker by the pid it reports all reach the worker
   itself).
3. ``worker_exec`` stays as the raylet's child and the worker's stand-in: it passes on every
   signal it gets to the worker and exits as the worker exited (the server reports it). If
   ``worker_exec`` dies (SIGKILL), the server kills the worker.

The server refuses a worker (and ``worker_exec`` then starts Ray's worker by ``exec``, as
without a server) whose environment differs from the server's in anything but the variables
the raylet sets per worker, since the server's modules read their settings at import: a
runtime environment with its own variables gets a fresh process. Ray is imported with the first
worker a raylet asks for, and Ray's variables are held to that worker's (:data:`RAYLET_PID_ENV`).
It also refuses everything when its imports left more than torch's own thread running (a fork
copies one thread only).

The server lives as long as the raylet it serves (it is told the raylet's pid after
``ray.init``) and never longer than the thread of the driver that started it (Linux's
parent-death signal); it imports nothing but the standard library until it is started.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

SOCKET_ENV = "ZBRL_WORKER_FORKSERVER"
"""The variable that gives ``worker_exec`` the server's socket (set while the raylet starts)."""

PRELOAD = (
    "torch",
    "sympy",
    "torch.fx.experimental.symbolic_shapes",
    "torch._dynamo",
    "torch.distributed.tensor",
    "transformers.utils",
    "transformers",
    "transformers.models",
    "transformers.integrations.accelerate",
    "transformers.integrations.deepgemm",
    "transformers.core_model_loading",
    "transformers.modeling_utils",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.llama.modeling_llama",  # the embedded model's and SmolLM2's
    "transformers.generation.utils",
    "zbrl.launch.worker_roles",
    "zbrl.assembly.models",
    "zbrl.rollout.backends.transformers.backend",
    "zbrl.rollout.producer",
    "zbrl.training.consumer",
)
"""What the server imports, in this order, for the workers it forks (transformers loads most of
its modules only when a model or tokenizer is first loaded, which is in every producer and
consumer); workers that ask meanwhile wait until the last is imported (see :func:`serve`). A
module that fails to import is left out: the worker imports it itself, or fails as it would
have. Ray is not here: see :data:`RAYLET_PID_ENV`."""

PRELOAD_CALLS = (("transformers.conversion_mapping", "get_checkpoint_conversion_mapping", "llama"),)
"""``(module, function, argument)`` called once :data:`PRELOAD` is imported, for what a library
builds on first use and keeps for the process: transformers' table of checkpoint conversions
(about 900 regular expressions compiled, 0.16 CPU-s) on the first model a process loads. Built
here, every forked producer, consumer and evaluator finds it built. A call that fails is left
out, as an import is."""

RAYLET_PID_ENV = "RAY_RAYLET_PID"
"""Set by a raylet in the environment of each worker it starts. Ray's modules, its C++ core
among them, read Ray's variables (the job's id, the authentication mode ``ray.init`` chose) once,
when first loaded, and a server started before the session cannot know them. So the server
imports Ray with the first worker that a raylet asks for, taking that worker's Ray variables as
its own, and from then on forks only workers with the same values of every ``RAY_`` variable
(the workers of one run's raylet and job); any other worker is started afresh. The first
worker waits for that import (0.15 s with torch imported), each later one is spared its own
(about 0.45 CPU-s)."""

PER_WORKER_ENV_PREFIXES = ("RAY_", "ZBRL_WORKER_FORKSERVER", "SPT_NOENV")
"""Variables that may differ between the server and a worker it forks (set by the raylet for
each worker; Ray's own are held to the values Ray was imported with, :data:`RAYLET_PID_ENV`)."""

FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
"""What ``worker_exec`` passes on to the worker it stands in for."""

MAX_REQUEST = 1 << 20
PR_SET_PDEATHSIG = 1


# --- the wire: a length-prefixed JSON message, with file descriptors on the first part


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    payload = struct.pack("!I", len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [payload], list(fds))
        payload = payload[sent:]
    if payload:
        sock.sendall(payload)


def receive_message(
    sock: socket.socket, with_fds: int = 0
) -> tuple[dict[str, Any] | None, list[int]]:
    """One message (None at the end of the stream) and the descriptors that came with it."""
    fds: list[int] = []
    if with_fds:
        data, fds, _flags, _addr = socket.recv_fds(sock, 65536, with_fds)
    else:
        data = sock.recv(65536)
    if not data:
        return None, fds
    while len(data) < 4:
        more = sock.recv(65536)
        if not more:
            return None, fds
        data += more
    (length,) = struct.unpack("!I", data[:4])
    if length > MAX_REQUEST:
        raise ValueError(f"a message of {length} bytes")
    data = data[4:]
    while len(data) < length:
        more = sock.recv(min(65536, length - len(data)))
        if not more:
            return None, fds
        data += more
    return json.loads(data[:length]), fds


# --- the server


def differing_values(own: Mapping[str, str], asked: Mapping[str, str]) -> list[str]:
    """The names set in one of ``own`` and ``asked`` and not to the same value in the other."""
    return sorted(n for n in {*own, *asked} if own.get(n) != asked.get(n))


def differing_environment(own: Mapping[str, str], asked: Mapping[str, str]) -> list[str]:
    """The variables (names) in which a worker's environment differs from the server's,
    leaving out those the raylet sets per worker."""
    return [n for n in differing_values(own, asked) if not n.startswith(PER_WORKER_ENV_PREFIXES)]


def ray_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("RAY_")}


def _names(names: list[str]) -> str:
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


class Server:
    """The fork server's loop: accepts workers, forks them, reports how they ended."""

    def __init__(self, listener: socket.socket, allowed_threads: int) -> None:
        self.listener = listener
        self.allowed_threads = allowed_threads
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.children: dict[int, socket.socket] = {}
        self.started_env = dict(os.environ)  # before the imports (some set variables)
        self.watched: int | None = None  # a pidfd: the raylet's
        self.ray_env: dict[str, str] | None = None  # Ray's variables when Ray was imported
        self.stopping = False

    def serve(self) -> None:
        while not self.stopping:
            self.serve_once(timeout=0.25)
        self.stop_children()

    def serve_once(self, timeout: float) -> None:
        """Take what has arrived (workers, the raylet's end, stand-ins gone) within
        ``timeout`` seconds, and reap the workers that ended."""
        for key, _ in self.selector.select(timeout=timeout):
            if key.data == "accept":
                self._accept()
            elif key.data == "raylet":
                self.stopping = True
            else:
                self._client_spoke(key.fileobj, key.data)
        self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10)
        try:
            request, fds = receive_message(conn, with_fds=3)
        except (OSError, ValueError):
            conn.close()
            return
        if request is None:
            conn.close()
            return
        if request.get("kind") == "follow":
            self._follow(int(request["pid"]))
            send_message(conn, {"following": True})
            conn.close()
            return
        if self.ray_env is None and RAYLET_PID_ENV in request["env"]:
            self._import_ray(request["env"])
        refusal = self._refusal(request, fds)
        if refusal is not None:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                send_message(conn, {"refused": refusal})
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            _become_worker(self, request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        try:
            send_message(conn, {"pid": pid})
        except OSError:  # its stand-in is gone already
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        conn.settimeout(None)
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _refusal(self, request: dict[str, Any], fds: list[int]) -> str | None:
        if len(fds) != 3:
            return f"{len(fds)} standard streams sent, 3 needed"
        threads = _thread_count()
        if threads > self.allowed_threads:
            return f"the server runs {threads} threads (its imports started some): forks unsafe"
        differing = differing_environment(self.started_env, request["env"])
        if differing:
            return f"the worker's environment differs from the server's in {_names(differing)}"
        if self.ray_env is not None:
            differing = differing_values(self.ray_env, ray_variables(request["env"]))
            if differing:
                return f"Ray was imported here with other values of {_names(differing)}"
        return None

    def _import_ray(self, env: dict[str, str]) -> None:
        """Import Ray with the Ray variables of ``env`` (a raylet's worker's) as this process's
        own (:data:`RAYLET_PID_ENV`)."""
        self.ray_env = ray_variables(env)
        for name in ray_variables(os.environ).keys() - self.ray_env.keys():
            del os.environ[name]
        os.environ.update(self.ray_env)
        self.started_env.update(self.ray_env)  # not the imports' to pass on: the worker's own
        with contextlib.suppress(Exception):
            import ray  # noqa: F401

    def set_by_imports(self) -> dict[str, str]:
        """The variables the server's imports set or changed (torch's inductor sets its cache
        folder, say)."""
        return {k: v for k, v in os.environ.items() if self.started_env.get(k) != v}

    def _follow(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return
        if self.watched is not None:
            self.selector.unregister(self.watched)
            os.close(self.watched)
        self.watched = fd
        self.selector.register(fd, selectors.EVENT_READ, "raylet")

    def _client_spoke(self, conn: Any, pid: int) -> None:
        """A stand-in's connection became readable: it ended (it sends nothing else)."""
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if not data and pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # reaped, and reported to no one, in _reap

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                self.selector.unregister(conn)
            with contextlib.suppress(OSError):
                send_message(conn, {"exit": os.waitstatus_to_exitcode(status)})
            conn.close()

    def stop_children(self, grace_s: float = 3.0) -> None:
        """End the workers still running (their raylet is gone, so are they soon)."""
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.children and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while self.children:
            self._reap()
            time.sleep(0.01)


def _become_worker(server: Server, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: take the stand-in's streams, directory, environment and signals,
    and run Ray's worker program as ``__main__``; never returns."""
    code = 1
    try:
        # a process group of its own, as the raylet gives each worker it starts: the raylet
        # ends a worker by signalling its group, which must not be the server's
        os.setsid()
        server.selector.close()
        server.listener.close()
        for conn in server.children.values():
            conn.close()
        if server.watched is not None:
            os.close(server.watched)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(server.set_by_imports())  # as a worker's own imports would have
        for signum in range(1, signal.NSIG):
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                if signum in request["ignored"]:
                    signal.signal(signum, signal.SIG_IGN)
                elif signal.getsignal(signum) not in (signal.SIG_DFL, None):
                    signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
        argv = request["argv"]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        import runpy

        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        _exit_like_python(code)


def _exit_like_python(code: int) -> None:
    """End the forked worker as an interpreter's end would (non-daemon threads joined,
    ``atexit`` run, streams flushed), then leave without unwinding into the server's code."""
    with contextlib.suppress(BaseException):
        import threading

        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
    with contextlib.suppress(BaseException):
        import atexit

        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def serve(socket_path: str) -> None:
    """The server's process: listen, import :data:`PRELOAD` and make :data:`PRELOAD_CALLS`,
    then fork workers until the raylet it follows ends.

    A worker that asks during the imports waits in the socket's queue until they are done: its
    stand-in has sent its request and waits for the answer (up to 120 s). Forked before, a
    producer or consumer imported the rest itself, beside the server still importing it, on the
    same two cores: with Ray's start shortened by the agent's stand-in
    (:func:`zbrl.launch.local_ray.replacements.idle_agent_replaced`) the run's workers ask 1 s
    before the
    imports end, and forking them only afterwards started the demo 0.2 s sooner (5.07 s
    against 5.31 s to the first metrics line) on 1.4 CPU-s less (docs/performance.md,
    Start-up). The hub, buffer and store, which need none of it, wait too; they are not what
    the run waits for."""
    _die_with_parent()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # bound under another name and renamed once listening: a stand-in finds either no socket
    # (and waits for it) or one that takes its connection, never one that refuses it
    binding = socket_path + ".binding"
    try:
        listener.bind(binding)
        listener.listen(64)
        os.rename(binding, socket_path)
        server = Server(listener, allowed_threads=_thread_count())

        def stop(signum: int, frame: Any) -> None:
            server.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the driver's
        # requests wait in the socket's queue until every import is done (see the docstring)
        for name in PRELOAD:
            if server.stopping:
                break
            threads = _thread_count()
            with contextlib.suppress(Exception):
                __import__(name)
            if name == "torch":  # its thread pool's thread, which it re-creates after a fork
                server.allowed_threads += max(_thread_count() - threads, 0)
        for module, function, argument in PRELOAD_CALLS:
            if server.stopping:
                break
            with contextlib.suppress(Exception):
                getattr(importlib.import_module(module), function)(argument)
        server.serve()
    finally:
        listener.close()
        for path in (binding, socket_path):
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(socket_path))


def _die_with_parent() -> None:
    """SIGTERM when the thread that started this process ends (or now, if it has)."""
    parent = os.getppid()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent or parent == 1:
        sys.exit(0)


# --- the driver's side


class ForkServer:
    """A started fork server, as the driver holds it."""

    def __init__(self, process: Any, socket_path: str, env: dict[str, str]) -> None:
        self.process = process
        self.socket_path = socket_path
        self.env = env
        """The environment the server started with (a worker's may differ in Ray's only)."""

    @contextlib.contextmanager
    def advertised(self) -> Iterator[None]:
        """While inside, processes started from here (the raylet) find the server."""
        saved = os.environ.get(SOCKET_ENV)
        os.environ[SOCKET_ENV] = self.socket_path
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(SOCKET_ENV, None)
            else:
                os.environ[SOCKET_ENV] = saved

    def follow(self, pid: int) -> bool:
        """Tell the server to end with process ``pid`` (the raylet); False if it is gone."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(120)  # answered once its imports are done, as a stand-in is
                _connect(sock, self.socket_path)
                send_message(sock, {"kind": "follow", "pid": pid}, [])
                answer, _ = receive_message(sock)
            return bool(answer and answer.get("following"))
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except Exception:
                self.process.kill()
                self.process.wait()


def start_fork_server() -> ForkServer | None:
    """Start a fork server for a local Ray about to start (None where this system has no
    ``fork``, Unix sockets or ``pidfd_open``)."""
    if not (hasattr(os, "fork") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")):
        return None
    import subprocess
    import tempfile

    folder = tempfile.mkdtemp(prefix="zbrl-fork-")
    path = os.path.join(folder, "socket")
    env = dict(os.environ)
    process = subprocess.Popen(
        [sys.executable, "-m", "zbrl.launch.local_ray.forkserver", path],
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # a signal to the driver's group is the driver's alone
    )
    return ForkServer(process, path, env)


# --- the stand-in's side (worker_exec)


def run_through_server(socket_path: str, argv: list[str]) -> int | None:
    """Have the server fork the worker ``argv`` and stand in for it: its exit code, or None
    when the server cannot be reached or refuses (the caller then starts the worker itself)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(2)
        _connect(sock, socket_path)
        blocked = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        ignored = [int(s) for s in signal.valid_signals() if _disposition(s) is signal.SIG_IGN]
        request = {
            "kind": "worker",
            "argv": argv,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "blocked": blocked,
            "ignored": ignored,
        }
        send_message(sock, request, [0, 1, 2])
        sock.settimeout(120)  # the server answers once its imports are done
        answer, _ = receive_message(sock)
    except (OSError, ValueError) as error:
        sock.close()
        _say(f"unreachable ({type(error).__name__}: {error})")
        return None
    if answer is None or "pid" not in answer:
        _say(answer["refused"] if answer and "refused" in answer else "closed without an answer")
        sock.close()
        return None
    return _stand_in(sock, int(answer["pid"]))


def _say(why: str) -> None:
    """One line on the worker's stderr (its Ray log) saying why it starts afresh."""
    line = f"[zbrl] worker fork server: {why}; the worker starts afresh"
    print(line, file=sys.stderr, flush=True)


def _connect(sock: socket.socket, socket_path: str, wait_s: float = 10.0) -> None:
    """Connect, waiting while the socket is not there yet in a folder that is (a server that
    has not bound it yet: its folder goes when it ends)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            sock.connect(socket_path)
            return
        except FileNotFoundError:
            if time.monotonic() > deadline or not os.path.isdir(os.path.dirname(socket_path)):
                raise
            time.sleep(0.02)


def _disposition(signum: int) -> Any:
    try:
        return signal.getsignal(signum)
    except (OSError, ValueError):
        return None


def _stand_in(sock: socket.socket, pid: int) -> int:
    """Pass signals on to ``pid`` until the server says how it ended."""

    def forward(signum: int, frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in FORWARDED_SIGNALS:
        if _disposition(signum) is not signal.SIG_IGN:
            signal.signal(signum, forward)
    sock.settimeout(None)
    try:
        answer, _ = receive_message(sock)
    except (OSError, ValueError):
        answer = None
    if answer is not None and "exit" in answer:
        code = int(answer["exit"])
    else:  # the server is gone: wait for the worker itself
        code = 1
        with contextlib.suppress(OSError):
            import select

            fd = os.pidfd_open(pid)
            select.select([fd], [], [])
    if code < 0:  # ended by a signal: end the same way
        with contextlib.suppress(OSError, ValueError):  # SIGKILL keeps its own
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    serve(sys.argv[1])
