"""Hard deadlines for functions that may run for ever (sympy inside math_verify).

A small pool of reusable worker processes runs a function and is killed when the deadline
passes (:func:`run_with_deadline`); a killed worker is replaced. Used by the rewards only: the
math answer check (:func:`zbrl.rewards.answer_check.answers_equivalent`), the reasoning-gym
scorers and user reward functions with ``timeout_s``. It bounds the time of trusted code that may
hang (sympy, a scorer); it contains nothing (the worker runs with this process's rights, files
and network), which is the sandbox's job (:mod:`zbrl.sandbox`, for untrusted programs).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import math
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT_S = 5.0
"""Default hard deadline of one math_verify comparison (seconds; the seed used 5 s alarms)."""


# --------------------------------------------------------------------------------------------
# Hard deadlines: a small pool of worker processes


class DeadlineExceeded(TimeoutError):
    """The function did not finish within its deadline; its worker process was killed."""


class WorkerCrashed(RuntimeError):
    """The worker process died while running the function."""


class WorkerStartError(RuntimeError):
    """A worker process could not be started (an environment problem: it is not retried)."""


_HEADER = struct.Struct(">Q")
_SELF_DESTRUCT_GRACE_S = 5
_WORKER_BOOT = (
    "import sys; from zbrl.rewards.deadline import _worker_main; _worker_main(sys.argv[1:])"
)


def _write_message(stream: Any, data: bytes) -> None:
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact_blocking(stream: Any, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _worker_main(preload: Sequence[str]) -> None:
    """Entry point of a worker process: run pickled ``(fn, [args, ...], kwargs, timeout_s)``
    requests, one call per ``args`` in order, each under its own deadline, one reply per call."""
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # stray prints of user functions go to stderr, not into the reply pipe
    # Self-destruct (default SIGALRM action) a little after the deadline, should the parent die.
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    for target in preload:
        module, _, function = target.partition(":")
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()
    _write_message(replies, pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            (size,) = _HEADER.unpack(_read_exact_blocking(requests, _HEADER.size))
            request = _read_exact_blocking(requests, size)
        except EOFError:
            return
        try:
            fn, calls, kwargs, timeout_s = pickle.loads(request)
        except Exception as exc:
            # one reply for the whole request: the parent fails all its calls with it
            _reply(replies, ("fatal", RuntimeError(f"worker cannot unpickle the task: {exc!r}")))
            continue
        for args in calls:
            signal.alarm(math.ceil(timeout_s) + _SELF_DESTRUCT_GRACE_S)
            try:
                reply: tuple[str, Any] = ("ok", fn(*args, **kwargs))
            except Exception as exc:
                reply = ("err", exc)
            finally:
                signal.alarm(0)
            _reply(replies, reply)


def _reply(replies: Any, reply: tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(reply)
    except Exception as exc:
        data = pickle.dumps(("err", RuntimeError(f"worker cannot pickle the result: {exc!r}")))
    _write_message(replies, data)


@dataclass(frozen=True)
class Failed:
    """The outcome of a call that raised (in :meth:`DeadlinePool.run_many`'s results)."""

    error: BaseException


class _Worker:
    """One worker process and its request/reply pipes."""

    def __init__(self, preload: Sequence[str], startup_timeout_s: float) -> None:
        env = dict(os.environ)
        paths = [p if p else os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the parent only
        )
        hint = "(its error, if any, is on stderr); or score in-process with timeout_s=None"
        try:
            status, _ = pickle.loads(self._receive(time.monotonic() + startup_timeout_s))
        except DeadlineExceeded:
            self.kill()
            raise WorkerStartError(
                f"the deadline worker process did not start within {startup_timeout_s} s {hint}"
            ) from None
        except WorkerCrashed as exc:
            self.kill()
            msg = f"the deadline worker process failed to start: {exc} {hint}"
            raise WorkerStartError(msg) from None
        except BaseException:
            self.kill()
            raise
        if status != "ready":
            self.kill()
            raise WorkerStartError(f"the deadline worker sent {status!r} instead of 'ready'")

    def send(self, request: bytes) -> None:
        try:
            assert self.proc.stdin is not None
            _write_message(self.proc.stdin, request)
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise WorkerCrashed(f"deadline worker is gone: {exc!r}") from None

    def reply(self, timeout_s: float) -> tuple[str, Any]:
        """The next call's reply, within ``timeout_s`` of now."""
        return pickle.loads(self._receive(time.monotonic() + timeout_s))

    def _receive(self, deadline: float) -> bytes:
        header = self._read_exact(_HEADER.size, deadline)
        (size,) = _HEADER.unpack(header)
        return self._read_exact(size, deadline)

    def _read_exact(self, n: int, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        buf = bytearray()
        while len(buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(max(1, math.ceil(remaining * 1000))):
                if time.monotonic() >= deadline:
                    raise DeadlineExceeded("deadline exceeded")
                continue
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                code = self.proc.poll()
                raise WorkerCrashed(f"deadline worker exited (exit code {code})")
            buf += chunk
        return bytes(buf)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class DeadlinePool:
    """Up to ``max_workers`` reusable worker processes that run functions under a deadline.

    A worker whose function misses its deadline (or that dies) is killed and replaced on demand;
    start-up time does not count against the deadline. Callers from many threads share the pool;
    when all workers are busy a caller waits for one. POSIX only.
    """

    def __init__(
        self,
        max_workers: int = 2,
        *,
        preload: Sequence[str] = ("zbrl.rewards.answer_check:warm_up",),
        startup_timeout_s: float = 120.0,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"DeadlinePool.max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.preload = tuple(preload)
        self.startup_timeout_s = startup_timeout_s
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._starting = 0
        self._prestarting = False
        """A worker is starting in :meth:`prestart`'s thread: the first call waits for it."""
        self._closed = False

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """``fn(*args, **kwargs)`` in a worker; raises :class:`DeadlineExceeded` after
        ``timeout_s`` seconds and :class:`WorkerCrashed` if the worker dies. Exceptions raised by
        ``fn`` are re-raised here. ``fn`` must be picklable (a module-level function)."""
        (outcome,) = self.run_many(fn, [args], timeout_s, kwargs)
        if isinstance(outcome, Failed):
            raise outcome.error
        return outcome

    def run_many(
        self,
        fn: Callable[..., Any],
        calls: Sequence[Sequence[Any]],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        kwargs: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """``fn(*args, **kwargs)`` for every ``args`` of ``calls``, in one worker and one round
        trip, each call under its own ``timeout_s`` deadline. Returns one outcome per call, in
        order: its value, or :class:`Failed` holding what it raised (``fn``'s exception,
        :class:`DeadlineExceeded`, :class:`WorkerCrashed`). A call that misses its deadline or
        kills its worker costs only itself: the calls after it go to a fresh worker."""
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        calls = [tuple(args) for args in calls]
        outcomes: list[Any] = []
        while len(outcomes) < len(calls):
            outcomes += self._run_batch(fn, calls[len(outcomes) :], timeout_s, kwargs)
        return outcomes

    def _run_batch(
        self,
        fn: Callable[..., Any],
        calls: list[tuple[Any, ...]],
        timeout_s: float,
        kwargs: Mapping[str, Any] | None,
    ) -> list[Any]:
        """Outcomes of a prefix of ``calls`` (all of them unless one killed the worker)."""
        try:
            request = pickle.dumps((fn, calls, dict(kwargs or {}), timeout_s))
        except Exception as exc:
            raise TypeError(
                f"run_with_deadline cannot send {fn!r} to a worker process ({exc}); pass a "
                f"module-level function and picklable arguments"
            ) from exc
        worker = self._acquire()
        outcomes: list[Any] = []
        healthy = False
        try:
            worker.send(request)
            for _ in calls:
                status, value = worker.reply(timeout_s)
                if status == "fatal":
                    outcomes += [Failed(value)] * (len(calls) - len(outcomes))
                    break
                outcomes.append(Failed(value) if status == "err" else value)
            healthy = True
        except DeadlineExceeded:
            outcomes.append(
                Failed(
                    DeadlineExceeded(
                        f"{getattr(fn, '__qualname__', fn)!s} did not finish within {timeout_s} s; "
                        f"its worker process was killed"
                    )
                )
            )
        except WorkerCrashed as exc:
            outcomes.append(Failed(exc))
        finally:
            self._release(worker, healthy)
        return outcomes

    def prestart(self) -> None:
        """Start one worker in a background thread when none is running or starting, so that
        the first call finds it ready instead of waiting for its start-up (an interpreter that
        imports ``preload``: about half a second of CPU for the answer checker, on the first
        scoring's path otherwise). A start that fails is left to the first call, which then
        starts a worker itself and reports why it fails."""
        with self._cond:
            if self._closed or self._all or self._starting:
                return
            self._starting += 1
            self._prestarting = True
        threading.Thread(target=self._prestart, name="deadline-prestart", daemon=True).start()

    def _prestart(self) -> None:
        worker = None
        with contextlib.suppress(BaseException):  # the first call starts one and says why
            worker = _Worker(self.preload, self.startup_timeout_s)
        with self._cond:
            self._starting -= 1
            self._prestarting = False
            if worker is not None and not self._closed:
                self._all.add(worker)
                self._idle.append(worker)
                worker = None
            self._cond.notify_all()
        if worker is not None:  # the pool was shut down meanwhile
            worker.kill()

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("DeadlinePool is shut down")
                if self._idle:
                    return self._idle.pop()
                if self._prestarting:  # the worker prestart() is starting comes first
                    self._cond.wait()
                    continue
                if len(self._all) + self._starting < self.max_workers:
                    self._starting += 1
                    break
                self._cond.wait()
        try:
            worker = _Worker(self.preload, self.startup_timeout_s)
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._starting -= 1
            self._all.add(worker)
        return worker

    def _release(self, worker: _Worker, healthy: bool) -> None:
        with self._cond:
            if healthy and not self._closed:
                self._idle.append(worker)
            else:
                self._all.discard(worker)
            self._cond.notify()
        if not healthy:
            worker.kill()

    def shutdown(self) -> None:
        """Kill every worker; later ``run`` calls raise."""
        with self._cond:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
            self._idle.clear()
            self._cond.notify_all()
        if os.getpid() == self.pid:
            for worker in workers:
                worker.kill()


_default_pool: DeadlinePool | None = None
_default_pool_lock = threading.Lock()


def default_pool() -> DeadlinePool:
    """The process-wide pool used by :func:`run_with_deadline` (a fresh one after a fork)."""
    global _default_pool
    with _default_pool_lock:
        if _default_pool is None or _default_pool.pid != os.getpid():
            if _default_pool is None:
                atexit.register(_shutdown_default_pool)
            _default_pool = DeadlinePool()
        return _default_pool


def _shutdown_default_pool() -> None:
    pool = _default_pool
    if pool is not None:
        pool.shutdown()


def run_with_deadline(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    kwargs: Mapping[str, Any] | None = None,
    pool: DeadlinePool | None = None,
) -> Any:
    """Run ``fn(*args, **kwargs)`` in a worker process and return its result within ``timeout_s``
    seconds, or raise :class:`DeadlineExceeded` (the worker is killed, so even a computation that
    holds the GIL in C code is stopped). Safe to call from any thread."""
    return (pool or default_pool()).run(fn, args, timeout_s, kwargs)


def run_many_with_deadline(
    fn: Callable[..., Any],
    calls: Sequence[Sequence[Any]],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    pool: DeadlinePool | None = None,
) -> list[Any]:
    """:func:`run_with_deadline` for many calls in one round trip to one worker (see
    :meth:`DeadlinePool.run_many`): a value or a :class:`Failed` per call."""
    return (pool or default_pool()).run_many(fn, calls, timeout_s)
