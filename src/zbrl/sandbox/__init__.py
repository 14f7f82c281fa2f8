"""Running untrusted Python programs: the code reward's tests and the Python tool's calls.

* :mod:`zbrl.sandbox.programs`: the API (:func:`run_program` and :func:`run_programs` against
  test cases, :func:`run_python` for one program and its output) and how test results are judged;
* :mod:`zbrl.sandbox.limits`: :class:`SandboxLimits`, the limits and the backend;
* :mod:`zbrl.sandbox.execution`: the parent's side: starting the runner under a backend, the
  deadlines, cleaning up its process group;
* :mod:`zbrl.sandbox.bubblewrap`: the ``bwrap`` jail, its probe, and choosing a backend;
* :mod:`zbrl.sandbox.runner`: the child's side, a standalone script run by its path.

This package imports no other zbrl package but :mod:`zbrl.errors`; ``rewards`` and
``environments`` build on it. See ``docs/sandbox.md``.
"""

from zbrl.sandbox.bubblewrap import SandboxUnavailableError
from zbrl.sandbox.execution import check_backend
from zbrl.sandbox.limits import SandboxBackend, SandboxLimits
from zbrl.sandbox.programs import (
    ProgramResult,
    PythonRun,
    TestCase,
    TestResult,
    parse_call_args,
    run_program,
    run_programs,
    run_python,
)

__all__ = [
    "ProgramResult",
    "PythonRun",
    "SandboxBackend",
    "SandboxLimits",
    "SandboxUnavailableError",
    "TestCase",
    "TestResult",
    "check_backend",
    "parse_call_args",
    "run_program",
    "run_programs",
    "run_python",
]
