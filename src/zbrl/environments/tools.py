"""Tools a model calls in an episode: the protocol, the built-ins (calculator, sandboxed Python)
and the one place a call runs, under a deadline, with every failure turned into a message.

A tool is any object with ``name`` (what ``hermes`` calls name), ``description`` (what the model
is told it does), ``parameters`` (the JSON schema of its arguments object), ``tag`` (the ``tags``
format's tag), ``argument`` (the argument the ``tags`` format's body fills) and
``call(arguments) -> str``. Name, description and parameters are what the model is told about
the tool (:mod:`zbrl.environments.tool_prompt`).
A tool reports a failure the model should see by raising :class:`ToolError`; any other exception
is a crash, a call past the deadline a timeout — all three are answered with an error message
and counted, never raised into the producer. A tool with ``thread_safe = True`` (both built-ins)
may be called from several episodes at once.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from zbrl.environments.calculator import CalculatorError, calculate
from zbrl.sandbox import SandboxLimits, run_python


class ToolError(Exception):
    """A failure the model is told about (bad arguments, the program failed)."""


class Tool(Protocol):
    name: str
    """What the model calls it by."""
    description: str
    """What the tool does, as the model is told (one or two sentences)."""
    parameters: dict[str, Any]
    """JSON schema of the arguments object (``{"type": "object", "properties": {...},
    "required": [...]}``), as chat templates with tools expect it."""
    tag: str
    argument: str

    def call(self, arguments: dict[str, Any]) -> str:
        """The result text; raise :class:`ToolError` for a failure the model should see."""
        ...


def string_parameter(name: str, description: str) -> dict[str, Any]:
    """The JSON schema of an arguments object with one required string ``name``."""
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": description}},
        "required": [name],
    }


class Calculator:
    """``calculate`` on the ``expression`` argument."""

    argument = "expression"
    thread_safe = True
    DESCRIPTION = (
        "Evaluates an arithmetic expression exactly and returns its value: numbers, "
        "+ - * / // % ** and parentheses (no variables or functions)."
    )

    def __init__(
        self, name: str = "calculator", tag: str = "calc", description: str | None = None
    ) -> None:
        self.name, self.tag = name, tag
        self.description = description or self.DESCRIPTION
        self.parameters = string_parameter(self.argument, "the expression, e.g. 347*628")

    def call(self, arguments: dict[str, Any]) -> str:
        expression = _string_argument(arguments, self.argument)
        try:
            return calculate(expression)
        except CalculatorError as e:
            raise ToolError(str(e)) from None


class SandboxedPython:
    """The ``code`` argument run as a program in the code sandbox; the result is its stdout, or
    an error with the tail of its stderr. The sandbox enforces the deadline itself."""

    argument = "code"
    own_deadline = True
    thread_safe = True
    DESCRIPTION = (
        "Runs a Python program in a sandbox (no network, no files) and returns what it prints; "
        "print the result you need."
    )

    def __init__(
        self,
        name: str = "python",
        tag: str = "python",
        *,
        description: str | None = None,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        backend: Literal["auto", "bwrap", "rlimits"] = "auto",
    ) -> None:
        self.name, self.tag = name, tag
        self.description = description or self.DESCRIPTION
        self.parameters = string_parameter(self.argument, "the program, e.g. print(347*628)")
        self.timeout_s, self.memory_mb, self.backend = timeout_s, memory_mb, backend

    def call(self, arguments: dict[str, Any]) -> str:
        code = _string_argument(arguments, self.argument)
        limits = SandboxLimits(
            timeout_s=self.timeout_s, memory_mb=self.memory_mb, backend=self.backend
        )
        run = run_python(code, "", limits)
        if run.status == "output_limit":  # what it printed before the limit, marked
            return run.stdout + "\n[output stopped at the sandbox's limit]"
        if run.status == "timeout":
            raise ToolTimeout(f"the program ran past {self.timeout_s:g} s and was stopped")
        if not run.ok:
            lines = run.stderr_tail.strip().splitlines()  # the exception is the last line
            detail = (lines[-1] if lines else "") or run.detail or run.status
            raise ToolError(f"the program failed ({run.status}): {detail}")
        return run.stdout


class ToolTimeout(ToolError):
    """The call missed its deadline."""


def _string_argument(arguments: dict[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str):
        raise ToolError(f'missing string argument "{name}"')
    return value


CallStatus = Literal["ok", "error", "timeout", "crash"]


@dataclass(frozen=True)
class CallOutcome:
    status: CallStatus
    text: str
    """The result, or the error message the model sees."""


_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="zbrl-tool")
"""Runs calls under their deadline: more threads than the runner's parallel steps (8), so a call
never waits for a thread while its deadline runs."""
_POOL_LOCK = threading.Lock()


def call_tool(tool: Tool, arguments: dict[str, Any], timeout_s: float) -> CallOutcome:
    """Run one call under ``timeout_s`` (tools that enforce their own deadline, like the
    sandbox, get a few seconds more to report it). A call past the deadline is answered at once;
    its thread cannot be killed and finishes in the background (a Python tool's program is
    killed by the sandbox)."""
    grace = 5.0 if getattr(tool, "own_deadline", False) else 0.0
    with _POOL_LOCK:
        future = _POOL.submit(tool.call, arguments)
    try:
        return CallOutcome("ok", str(future.result(timeout=timeout_s + grace)))
    except FutureTimeout:
        return CallOutcome("timeout", f"error: {tool.name} did not answer within {timeout_s:g} s")
    except ToolTimeout as e:
        return CallOutcome("timeout", f"error: {e}")
    except ToolError as e:
        return CallOutcome("error", f"error: {e}")
    except Exception as e:  # a crashing tool is answered, never raised into the producer
        return CallOutcome("crash", f"error: {tool.name} failed: {type(e).__name__}: {e}")
