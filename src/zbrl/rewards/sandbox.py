"""A local sandbox that runs untrusted Python programs against test cases.

Used by the ``code`` reward. Every candidate program runs in its own interpreter
(``python -I -S``: isolated mode, no site-packages, no ``PYTHON*`` variables) in a fresh temporary
working directory that is removed afterwards, with a minimal explicit environment, as the leader
of a new process group that is killed when the candidate is done. That interpreter (the *runner*,
``_sandbox_runner.py``) compiles the program once and forks one *test process* per test case; the
test process applies resource limits (address space, CPU time, file size, open files, process
count), installs an audit hook that denies process creation, sockets, writes outside the working
directory and reads outside the standard library, and runs the program. Where ``unshare --net``
works, the runner also starts in an empty network namespace.

Per-test wall-clock limits are enforced twice: by the runner (kills the test process) and by this
module (kills the whole process group when the runner does not report in time). After a timeout the
remaining tests of that candidate are not run (status ``"skipped"``) unless
``SandboxLimits.continue_after_timeout`` is set.

This is containment for buggy and runaway programs, not a security boundary: see
``docs/sandbox.md`` for what it does not protect against.

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
from typing import Any, Literal

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
    """Start the runner in an empty network namespace when ``unshare --net`` works here."""

    def __post_init__(self) -> None:
        positive = {
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_mb,
            "max_output_bytes": self.max_output_bytes,
            "max_stderr_bytes": self.max_stderr_bytes,
            "max_file_bytes": self.max_file_bytes,
            "max_processes": self.max_processes,
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
    """True when the program ran in an empty network namespace."""
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
    """The runner's whole environment: nothing is inherited from this process."""
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
    job_limits = asdict(limits)
    job_limits["cpu_s"] = limits.effective_cpu_s
    job = {"source": source, "fn_name": fn_name, "inputs": inputs, "limits": job_limits}
    prefix = _unshare_prefix() if limits.network_namespace else ()
    command = [*prefix, sys.executable, "-I", "-S", "-B", "-X", "utf8", str(_RUNNER)]
    workdir = tempfile.mkdtemp(prefix="zbrl-sandbox-")
    try:
        with open(os.path.join(workdir, "job.marshal"), "wb") as f:
            marshal.dump(job, f)
        raws, pid = _run_runner(command, workdir, len(tests), limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results = [_judge(raw, test, fn_name is not None) for raw, test in zip(raws, tests)]
    return ProgramResult(tests=results, pid=pid, network_namespace=bool(prefix))


def _run_runner(
    command: list[str], workdir: str, n_tests: int, limits: SandboxLimits
) -> tuple[list[dict[str, Any]], int | None]:
    try:
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=_child_env(workdir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        failure = {"status": "sandbox_error", "detail": f"cannot start the sandbox: {exc}"}
        return [dict(failure) for _ in range(n_tests)], None
    try:
        raws = _collect(proc, n_tests, limits)
    finally:
        _kill_group(proc)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
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


def _collect(proc: subprocess.Popen, n_tests: int, limits: SandboxLimits) -> list[dict[str, Any]]:
    """Read the runner's reports, enforcing the startup, per-test and total deadlines."""
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
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
        sel.register(out_fd, selectors.EVENT_READ)
        sel.register(err_fd, selectors.EVENT_READ)
        while open_fds:
            remaining = min(deadline, total_end) - time.monotonic()
            if remaining <= 0:
                overrun = "timeout" if ready else "startup"
                break
            for key, _ in sel.select(remaining):
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
