"""A local sandbox that runs untrusted Python programs against test cases.

Used by the ``code`` reward, and reusable as :func:`run_python` (one program, one stdin, its
output back) by tools. Every candidate program runs in its own interpreter (``python -I -S``:
isolated mode, no site-packages, no ``PYTHON*`` variables) with a minimal explicit environment, as
the leader of a new process group that is killed when the candidate is done. That interpreter (the
*runner*, ``_sandbox_runner.py``) compiles the program once and forks one *test process* per test
case; the test process applies resource limits (address space, CPU time, file size, open files,
process count), installs an audit hook that denies process creation, sockets, writes outside the
working directory and reads outside the standard library, and runs the program.

Two backends (``SandboxLimits.backend``):

* ``bwrap``: the runner starts under bubblewrap, in its own user, PID, mount, network, IPC and UTS
  namespaces, with all capabilities dropped; it sees a read-only ``/usr`` (and ``/bin``, ``/lib``
  ...), the interpreter's own installation, a fresh ``/proc`` and ``/dev``, and an empty tmpfs at
  ``/tmp`` as its working directory. The checkout, home directories, ``/etc`` and the host's
  network are not there. This is the containment layer; the rlimits and the audit hook still apply
  inside it.
* ``rlimits``: the runner starts directly, in a fresh temporary directory on the host (removed
  afterwards), and, where ``unshare --net`` works, in an empty network namespace. Only the rlimits
  and the audit hook contain the program: containment for buggy and runaway programs, not a
  security boundary.
* ``auto`` (default): ``bwrap`` when a probe finds it installed and working (once per process),
  else ``rlimits`` with a one-time warning that says how to install bubblewrap.

Per-test wall-clock limits are enforced twice: by the runner (kills the test process) and by this
module (kills the whole process group when the runner does not report in time). After a timeout the
remaining tests of that candidate are not run (status ``"skipped"``) unless
``SandboxLimits.continue_after_timeout`` is set.

See ``docs/sandbox.md`` for what each backend contains and what it does not.

Test formats:

* stdin/stdout (``fn_name=None``): ``TestCase.input`` is fed to stdin; stdout is compared to
  ``TestCase.expected`` line by line after stripping trailing whitespace from every line and
  dropping trailing blank lines.
* function call (``fn_name="f"``): ``TestCase.input`` is JSON — either one JSON array holding the
  positional arguments (``"[[1, 2, 3], 5]"`` calls ``f([1, 2, 3], 5)``), or, when the whole text is
  not one JSON array, one JSON value per non-empty line, one argument each. The program's top-level
  function ``f`` is called, or ``Solution().f`` when a class ``Solution`` defines it.
  ``TestCase.expected`` is the JSON of the expected return value. Both sides are compared after a
  JSON round trip (tuples become lists); an expected one-element list ``[x]`` also accepts ``x``
  (the APPS/TACO convention of wrapping return values).
"""

from __future__ import annotations

import ast
import contextlib
import json
import marshal
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args

from zbrl.rewards import bubblewrap
from zbrl.rewards._sandbox_runner import user_task_count

SandboxBackend = Literal["auto", "bwrap", "rlimits"]
"""Which sandbox runs programs: bubblewrap namespaces, rlimits and the audit hook only, or the
first when it works here."""

TestStatus = Literal[
    "pass",
    "wrong_answer",
    "timeout",
    "runtime_error",
    "memory",
    "output_limit",
    "sandbox_error",
    "skipped",
]

_RUNNER = Path(__file__).with_name("_sandbox_runner.py")
_STARTUP_S = 15.0
"""How long the runner may take to start and compile before it is declared broken."""
_GRACE_S = 2.0
"""Extra time the parent allows per test on top of ``timeout_s`` before killing the group."""
_STDERR_TAIL_CHARS = 2048
_MISSING = object()


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one candidate program (each test gets the per-test limits afresh)."""

    timeout_s: float = 5.0
    """Wall-clock limit per test, in seconds."""
    cpu_s: int | None = None
    """CPU-time limit per test (RLIMIT_CPU), in seconds; None means ``ceil(timeout_s) + 1``."""
    memory_mb: int = 512
    """Address-space limit per test process (RLIMIT_AS), in MiB."""
    max_output_bytes: int = 64 * 1024
    """Most bytes a test may write to stdout (and the most a returned value may encode to)."""
    max_stderr_bytes: int = 1024 * 1024
    """Most bytes a test may write to stderr (only the tail is kept)."""
    max_file_bytes: int = 16 * 1024 * 1024
    """Largest file a test may write (RLIMIT_FSIZE), in bytes."""
    max_open_files: int = 64
    """Open file descriptors per test process (RLIMIT_NOFILE)."""
    max_processes: int = 16
    """Extra tasks beyond those the user already runs (RLIMIT_NPROC; not applied for root, which
    the kernel exempts anyway). Process creation is also denied by the audit hook."""
    total_timeout_s: float | None = None
    """Wall-clock limit for all tests of one candidate together; None means no extra limit."""
    continue_after_timeout: bool = False
    """Keep running the remaining tests after one times out (default: mark them skipped)."""
    network_namespace: bool = True
    """``rlimits`` backend: start the runner in an empty network namespace when ``unshare --net``
    works here (the ``bwrap`` backend always has its own network namespace)."""
    backend: SandboxBackend = "auto"
    """``bwrap``, ``rlimits``, or ``auto`` (bwrap when it works here, else rlimits with a
    warning)."""
    max_workdir_bytes: int = 64 * 1024 * 1024
    """``bwrap`` backend: size of the tmpfs that is the working directory (all files together);
    the ``rlimits`` backend caps single files only."""

    def __post_init__(self) -> None:
        positive = {
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_mb,
            "max_output_bytes": self.max_output_bytes,
            "max_stderr_bytes": self.max_stderr_bytes,
            "max_file_bytes": self.max_file_bytes,
            "max_processes": self.max_processes,
            "max_workdir_bytes": self.max_workdir_bytes,
        }
        if self.cpu_s is not None:
            positive["cpu_s"] = self.cpu_s
        if self.total_timeout_s is not None:
            positive["total_timeout_s"] = self.total_timeout_s
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {value!r}")
        if self.memory_mb < 64:
            raise ValueError(
                f"SandboxLimits.memory_mb must be at least 64 (the interpreter needs it), "
                f"got {self.memory_mb}"
            )
        if self.backend not in get_args(SandboxBackend):
            raise ValueError(
                f"SandboxLimits.backend must be one of {list(get_args(SandboxBackend))}, "
                f"got {self.backend!r}"
            )
        if self.max_open_files < 16:
            raise ValueError(
                f"SandboxLimits.max_open_files must be at least 16, got {self.max_open_files}"
            )

    @property
    def effective_cpu_s(self) -> int:
        """The RLIMIT_CPU value used per test."""
        if self.cpu_s is not None:
            return self.cpu_s
        return int(-(-self.timeout_s // 1)) + 1


@dataclass(frozen=True)
class TestCase:
    """One test: stdin text and expected stdout, or JSON arguments and JSON return value."""

    __test__ = False  # not a pytest test class

    input: str
    expected: str


@dataclass(frozen=True)
class TestResult:
    """What happened in one test."""

    __test__ = False

    status: TestStatus
    duration_s: float = 0.0
    """Wall-clock time of the test process (0 for tests that did not run)."""
    stderr_tail: str = ""
    """The last ~2 KiB of the program's stderr (or of the failure that stopped it)."""
    detail: str = ""
    """A short reason for a failure (exception, signal, limit)."""

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass
class ProgramResult:
    """The outcome of one candidate program over its tests."""

    tests: list[TestResult]
    pid: int | None = None
    """Process id (and process-group id) of the runner; the group is gone when this returns."""
    network_namespace: bool = False
    """True when the program ran in a network namespace of its own."""
    backend: Literal["bwrap", "rlimits"] = "rlimits"
    """The backend that ran the program (``auto`` resolved)."""
    passed: list[bool] = field(init=False)
    pass_fraction: float = field(init=False)

    def __post_init__(self) -> None:
        self.passed = [t.passed for t in self.tests]
        self.pass_fraction = sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)

    @property
    def statuses(self) -> list[str]:
        return [t.status for t in self.tests]


# ------------------------------------------------------------------------------------------------
# Comparison helpers (run in the trusted parent; expected outputs never reach the sandbox)
# ------------------------------------------------------------------------------------------------


def normalise_stdout(text: str) -> list[str]:
    """Lines with trailing whitespace stripped and trailing blank lines dropped."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def parse_call_args(text: str) -> list[Any]:
    """Positional arguments from a function-call test input (see the module docstring)."""
    try:
        whole = json.loads(text)
    except ValueError:
        whole = _MISSING
    if isinstance(whole, list):
        return whole
    args = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            args.append(json.loads(line))
        except ValueError as exc:
            raise ValueError(
                f"function-call input line {number} is not JSON ({exc}); write the arguments "
                f"as one JSON array, e.g. '[[1, 2], 3]', or one JSON value per line"
            ) from None
    if not args:
        raise ValueError("function-call input is empty; write the arguments as a JSON array")
    return args


def _returns_match(got: Any, expected: Any) -> bool:
    if got == expected:
        return True
    return isinstance(expected, list) and len(expected) == 1 and got == expected[0]


def _judge(raw: dict[str, Any], test: TestCase, fn_mode: bool) -> TestResult:
    status = raw["status"]
    detail = str(raw.get("detail") or "")
    if status == "ok":
        if fn_mode:
            try:
                got = json.loads(raw.get("ret") or "")
            except ValueError:
                got, status, detail = None, "runtime_error", "no return value reported"
            if status == "ok":
                correct = _returns_match(got, json.loads(test.expected))
                status = "pass" if correct else "wrong_answer"
        else:
            stdout = str(raw.get("stdout") or "")
            correct = normalise_stdout(stdout) == normalise_stdout(test.expected)
            status = "pass" if correct else "wrong_answer"
    return TestResult(
        status=status,
        duration_s=float(raw.get("duration") or 0.0),
        stderr_tail=str(raw.get("stderr") or "")[-_STDERR_TAIL_CHARS:],
        detail=detail,
    )


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------


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


def _validate(tests: Sequence[TestCase], fn_name: str | None) -> list[str]:
    """Check the tests up front; return what the runner receives as inputs."""
    if not tests:
        raise ValueError("run_program needs at least one TestCase")
    if fn_name is not None and (not isinstance(fn_name, str) or not fn_name.isidentifier()):
        raise ValueError(f"fn_name must be a Python identifier or None, got {fn_name!r}")
    inputs = []
    for i, test in enumerate(tests):
        if not isinstance(test.input, str) or not isinstance(test.expected, str):
            raise ValueError(f"test {i}: TestCase.input and TestCase.expected must be strings")
        if fn_name is None:
            inputs.append(test.input)
            continue
        try:
            args = parse_call_args(test.input)
        except ValueError as exc:
            raise ValueError(f"test {i}: {exc}") from None
        try:
            json.loads(test.expected)
        except ValueError as exc:
            raise ValueError(
                f"test {i}: expected return value is not JSON ({exc}); in function-call mode "
                f"write the JSON of the value, e.g. '\"abc\"' for the string abc"
            ) from None
        inputs.append(json.dumps(args))
    return inputs


def check_backend(limits: SandboxLimits) -> Literal["bwrap", "rlimits"]:
    """The backend ``limits`` resolves to here; raises
    :class:`~zbrl.rewards.bubblewrap.SandboxUnavailableError` when
    ``bwrap`` is asked for and does not work (``auto`` falls back with a one-time warning)."""
    return bubblewrap.resolve_backend(limits.backend)


def run_program(
    source: str,
    tests: Sequence[TestCase],
    *,
    fn_name: str | None = None,
    limits: SandboxLimits | None = None,
) -> ProgramResult:
    """Run ``source`` against ``tests`` in the sandbox; see the module docstring for formats."""
    if not isinstance(source, str):
        raise TypeError(f"run_program: source must be a str, got {type(source).__name__}")
    limits = limits or SandboxLimits()
    tests = list(tests)
    inputs = _validate(tests, fn_name)
    run = _execute(source, inputs, fn_name, limits)
    results = [_judge(raw, test, fn_name is not None) for raw, test in zip(run.raws, tests)]
    return ProgramResult(
        tests=results, pid=run.pid, network_namespace=run.network_namespace, backend=run.backend
    )


PythonStatus = Literal["ok", "timeout", "runtime_error", "memory", "output_limit", "sandbox_error"]


@dataclass(frozen=True)
class PythonRun:
    """What one program did (:func:`run_python`)."""

    status: PythonStatus
    """``ok`` when the program ran to the end and exited with status 0."""
    stdout: str
    """What it printed (up to ``max_output_bytes``; partial when it failed or was stopped)."""
    stderr_tail: str
    """The last ~2 KiB of its stderr (a traceback, a syntax error)."""
    detail: str
    """A short reason for a failure (exception, signal, limit)."""
    duration_s: float
    """Wall-clock time of the program."""
    backend: Literal["bwrap", "rlimits"]
    """The sandbox that ran it."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> PythonRun:
    """Run one Python program with ``stdin`` in the sandbox and return its output.

    The building block for tools (a Python interpreter in a multi-turn episode): the same
    sandbox, limits and backends as the ``code`` reward, with the program's stdout and stderr
    returned instead of compared.
    """
    if not isinstance(code, str) or not isinstance(stdin, str):
        raise TypeError("run_python: code and stdin must be strings")
    run = _execute(code, [stdin], None, limits or SandboxLimits())
    raw = run.raws[0]
    status = raw["status"]
    if status == "skipped":  # unreachable with one input; keep the type honest
        status = "sandbox_error"
    return PythonRun(
        status=status,
        stdout=str(raw.get("stdout") or ""),
        stderr_tail=str(raw.get("stderr") or "")[-_STDERR_TAIL_CHARS:],
        detail=str(raw.get("detail") or ""),
        duration_s=float(raw.get("duration") or 0.0),
        backend=run.backend,
    )


@dataclass(frozen=True)
class _Execution:
    raws: list[dict[str, Any]]
    pid: int | None
    backend: Literal["bwrap", "rlimits"]
    network_namespace: bool


def _execute(
    source: str, inputs: list[str], fn_name: str | None, limits: SandboxLimits
) -> _Execution:
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
        jail = bubblewrap.jail_argv(probe.path, limits.max_workdir_bytes, str(_RUNNER))
        command = [*jail, bubblewrap.interpreter(), *flags, bubblewrap.JAIL_RUNNER]
        env = bubblewrap.jail_env()
        raws, pid = _run_runner(command, "/", env, marshal.dumps(job), len(inputs), limits)
        return _Execution(raws, pid, "bwrap", True)
    prefix = _unshare_prefix() if limits.network_namespace else ()
    command = [*prefix, sys.executable, *flags, str(_RUNNER)]
    workdir = tempfile.mkdtemp(prefix="zbrl-sandbox-")
    try:
        env = _child_env(workdir)
        raws, pid = _run_runner(command, workdir, env, marshal.dumps(job), len(inputs), limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _Execution(raws, pid, "rlimits", bool(prefix))


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
                    err_tail = (err_tail + chunk)[-_STDERR_TAIL_CHARS:]
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


def run_programs(
    candidates: Sequence[tuple[str, Sequence[TestCase], str | None]],
    limits: SandboxLimits | None = None,
    max_workers: int = 2,
) -> list[ProgramResult]:
    """Run many ``(source, tests, fn_name)`` candidates, ``max_workers`` at a time, in order."""
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    limits = limits or SandboxLimits()
    for index, (_, tests, fn_name) in enumerate(candidates):
        try:
            _validate(list(tests), fn_name)
        except ValueError as exc:
            raise ValueError(f"candidate {index}: {exc}") from None
    if not candidates:
        return []

    def one(candidate: tuple[str, Sequence[TestCase], str | None]) -> ProgramResult:
        source, tests, fn_name = candidate
        return run_program(source, tests, fn_name=fn_name, limits=limits)

    if max_workers == 1 or len(candidates) == 1:
        return [one(c) for c in candidates]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(candidates))) as pool:
        return list(pool.map(one, candidates))
