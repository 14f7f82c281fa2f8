"""Running the sandbox's runner (:mod:`zbrl.sandbox.runner`) over a program's inputs: the
command line of each backend, the runner's environment, and the parent's side of the protocol
(sending the job, reading the reports, enforcing the start-up, per-test and total deadlines,
killing the process group). What the reports mean is :mod:`zbrl.sandbox.programs`' business.
"""

from __future__ import annotations

import ast
import contextlib
import marshal
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from zbrl.sandbox import bubblewrap
from zbrl.sandbox.limits import SandboxLimits
from zbrl.sandbox.runner import user_task_count

RUNNER = Path(__file__).with_name("runner.py")
"""The runner script; run by its path (``python -I -S ... runner.py``), never imported there."""
STDERR_TAIL_CHARS = 2048
"""How much of a program's (or the runner's) stderr is kept: the tail."""
_STARTUP_S = 15.0
"""How long the runner may take to start and compile before it is declared broken."""
_GRACE_S = 2.0
"""Extra time the parent allows per test on top of ``timeout_s`` before killing the group."""


@lru_cache(maxsize=1)
def _unshare_prefix() -> tuple[str, ...]:
    """``("/usr/bin/unshare", "--net", "--")`` when an empty network namespace can be made."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        probe = subprocess.run(
            [exe, "--net", "--", "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    return (exe, "--net", "--") if probe.returncode == 0 else ()


def _child_env(workdir: str) -> dict[str, str]:
    """The runner's whole environment under ``rlimits``: nothing is inherited from this process."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
    }


def check_backend(limits: SandboxLimits) -> Literal["bwrap", "rlimits"]:
    """The backend ``limits`` resolves to here; raises
    :class:`~zbrl.sandbox.bubblewrap.SandboxUnavailableError` when
    ``bwrap`` is asked for and does not work (``auto`` falls back with a one-time warning)."""
    return bubblewrap.resolve_backend(limits.backend)


@dataclass(frozen=True)
class Execution:
    """What the runner reported for each input (raw reports), and how it ran."""

    raws: list[dict[str, Any]]
    pid: int | None
    backend: Literal["bwrap", "rlimits"]
    network_namespace: bool


def execute(
    source: str, inputs: list[str], fn_name: str | None, limits: SandboxLimits
) -> Execution:
    """Run the runner over ``inputs`` under the backend ``limits`` resolves to."""
    backend = check_backend(limits)
    job_limits = asdict(limits)
    job_limits["cpu_s"] = limits.effective_cpu_s
    job: dict[str, Any] = {"source": source, "fn_name": fn_name, "inputs": inputs}
    job["limits"] = job_limits
    flags = ["-I", "-S", "-B", "-X", "utf8"]
    if backend == "bwrap":
        # RLIMIT_NPROC counts the user's tasks on the host, which the jail's /proc cannot see.
        uid = os.getuid()
        job["nproc"] = None if uid == 0 else user_task_count(uid) + limits.max_processes
        probe = bubblewrap.probe_bwrap()
        assert probe.path is not None
        jail = bubblewrap.jail_argv(probe.path, limits.max_workdir_bytes, str(RUNNER))
        command = [*jail, bubblewrap.interpreter(), *flags, bubblewrap.JAIL_RUNNER]
        env = bubblewrap.jail_env()
        raws, pid = _run_runner(command, "/", env, marshal.dumps(job), len(inputs), limits)
        return Execution(raws, pid, "bwrap", True)
    prefix = _unshare_prefix() if limits.network_namespace else ()
    command = [*prefix, sys.executable, *flags, str(RUNNER)]
    workdir = tempfile.mkdtemp(prefix="zbrl-sandbox-")
    try:
        env = _child_env(workdir)
        raws, pid = _run_runner(command, workdir, env, marshal.dumps(job), len(inputs), limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return Execution(raws, pid, "rlimits", bool(prefix))


def _run_runner(
    command: list[str],
    cwd: str,
    env: dict[str, str],
    job: bytes,
    n_tests: int,
    limits: SandboxLimits,
) -> tuple[list[dict[str, Any]], int | None]:
    try:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        failure = {"status": "sandbox_error", "detail": f"cannot start the sandbox: {exc}"}
        return [dict(failure) for _ in range(n_tests)], None
    try:
        raws = _collect(proc, job, n_tests, limits)
    finally:
        _kill_group(proc)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        _wait_group_gone(proc.pid)
    return raws, proc.pid


def _kill_group(proc: subprocess.Popen) -> None:
    # Called before the runner is reaped, so its pid (= the group id) cannot have been reused.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _wait_group_gone(pgid: int, timeout_s: float = 2.0) -> None:
    """Wait briefly until no process of the group is left.

    The runner reaps its test processes itself, so normally the group is gone as soon as the
    runner is. Only when the parent had to kill the runner mid-test is a test process orphaned;
    init then reaps it, which this waits for so that callers see a clean process table.
    """
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.01)


def _collect(
    proc: subprocess.Popen, job: bytes, n_tests: int, limits: SandboxLimits
) -> list[dict[str, Any]]:
    """Send the job to the runner's stdin and read its reports, enforcing the startup, per-test
    and total deadlines (writing never blocks, so a runner that stalls cannot hang this)."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    in_fd, out_fd, err_fd = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
    os.set_blocking(in_fd, False)
    pending = memoryview(job)
    raws: list[dict[str, Any] | None] = [None] * n_tests
    start = time.monotonic()
    deadline = start + _STARTUP_S
    total_end = float("inf")
    if limits.total_timeout_s is not None:  # the runner enforces it; this is the backstop
        total_end = start + _STARTUP_S + limits.total_timeout_s + _GRACE_S
    buf = bytearray()
    err_tail = bytearray()
    ready = False
    compile_error: str | None = None
    overrun: str | None = None
    open_fds = 2
    with selectors.DefaultSelector() as sel:
        sel.register(in_fd, selectors.EVENT_WRITE)
        sel.register(out_fd, selectors.EVENT_READ)
        sel.register(err_fd, selectors.EVENT_READ)
        while open_fds:
            remaining = min(deadline, total_end) - time.monotonic()
            if remaining <= 0:
                overrun = "timeout" if ready else "startup"
                break
            for key, _ in sel.select(remaining):
                if key.fd == in_fd:
                    try:
                        pending = pending[os.write(in_fd, pending[: 1 << 16]) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # the runner is gone; its stderr says why
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(in_fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    open_fds -= 1
                elif key.fd == err_fd:
                    err_tail = (err_tail + chunk)[-STDERR_TAIL_CHARS:]
                else:
                    buf += chunk
            while b"\n" in buf:
                line, _, rest = bytes(buf).partition(b"\n")
                buf = bytearray(rest)
                message = ast.literal_eval(line.decode("utf-8"))
                event = message["ev"]
                if event == "ready":
                    ready = True
                elif event == "compile_error":
                    compile_error = str(message["error"])
                elif event == "done":
                    raws[int(message["i"])] = message
                deadline = time.monotonic() + limits.timeout_s + _GRACE_S
    runner_stderr = err_tail.decode("utf-8", "replace")
    return _fill_missing(raws, compile_error, overrun, runner_stderr, limits)


def _fill_missing(
    raws: list[dict[str, Any] | None],
    compile_error: str | None,
    overrun: str | None,
    runner_stderr: str,
    limits: SandboxLimits,
) -> list[dict[str, Any]]:
    """Statuses for the tests the runner did not report on."""
    done = [r for r in raws if r is not None]
    stopped_by_timeout = (
        bool(done)
        and done[-1]["status"] == "timeout"
        and (bool(done[-1].get("total_exhausted")) or not limits.continue_after_timeout)
    )
    filled: list[dict[str, Any]] = []
    first_missing = True
    for raw in raws:
        if raw is not None:
            filled.append(raw)
            continue
        if compile_error is not None:
            record = {
                "status": "runtime_error",
                "stderr": compile_error,
                "detail": "does not compile",
            }
        elif overrun == "timeout" and first_missing:
            record = {"status": "timeout", "detail": "killed by the parent (deadline overrun)"}
        elif overrun == "timeout" or stopped_by_timeout:
            record = {"status": "skipped", "detail": "not run after an earlier timeout"}
        elif overrun == "startup":
            record = {"status": "sandbox_error", "detail": "the sandbox did not start in time"}
        else:
            record = {
                "status": "sandbox_error",
                "stderr": runner_stderr,
                "detail": "the sandbox runner exited before reporting this test",
            }
        first_missing = False
        filled.append(record)
    return filled
