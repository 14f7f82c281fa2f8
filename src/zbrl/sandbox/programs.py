"""A local sandbox that runs untrusted Python programs against test cases.

Used by the ``code`` reward, and reusable as :func:`run_python` (one program, one stdin, its output
back) by tools. Every candidate program runs in its own interpreter (``python -I -S``: isolated
mode, no site-packages, no ``PYTHON*`` variables) with a minimal explicit environment, as the
leader of a new process group that is killed when the candidate is done. That interpreter (the
*runner*, :mod:`zbrl.sandbox.runner`, started by :mod:`zbrl.sandbox.execution`) compiles the
program once and forks one *test process* per test case; the test process applies resource limits
(address space, CPU time, file size, open files, process count), installs an audit hook that denies
process creation, sockets, writes outside the working directory and reads outside the standard
library, and runs the program.

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

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from zbrl.sandbox.execution import STDERR_TAIL_CHARS, execute
from zbrl.sandbox.limits import SandboxLimits

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
_MISSING = object()


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
        stderr_tail=str(raw.get("stderr") or "")[-STDERR_TAIL_CHARS:],
        detail=detail,
    )


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
    run = execute(source, inputs, fn_name, limits)
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
    run = execute(code, [stdin], None, limits or SandboxLimits())
    raw = run.raws[0]
    status = raw["status"]
    if status == "skipped":  # unreachable with one input; keep the type honest
        status = "sandbox_error"
    return PythonRun(
        status=status,
        stdout=str(raw.get("stdout") or ""),
        stderr_tail=str(raw.get("stderr") or "")[-STDERR_TAIL_CHARS:],
        detail=str(raw.get("detail") or ""),
        duration_s=float(raw.get("duration") or 0.0),
        backend=run.backend,
    )


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
