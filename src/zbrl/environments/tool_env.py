"""The built-in ``tools`` environment: every call in a model turn runs and its result is the next
message; a turn without a call is the final answer.

Results are wrapped in the format's own way (``hermes``: one ``<tool_response>…</tool_response>``
per call; ``tags``: the bare results, one per line) and cut at ``max_result_chars``. A malformed
call, an unknown tool, a tool error, crash or timeout becomes an ``error: …`` line in the message
(or, with ``on_error: end``, ends the episode) and is counted: ``tool_calls`` (calls seen, well-
formed or not), ``tool_errors`` (all failures), and by kind ``malformed_calls``,
``unknown_tools``, ``tool_timeouts``, ``tool_crashes``; ``results_cut`` counts long results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from zbrl.environments.base import EnvTurn
from zbrl.environments.tool_calls import (
    HERMES_CLOSE,
    MalformedCall,
    ParsedCall,
    parse_hermes,
    parse_tags,
)
from zbrl.environments.tools import CallOutcome, Tool, call_tool

_FAILURE_COUNT = {"timeout": "tool_timeouts", "crash": "tool_crashes", "error": "tool_failures"}


@dataclass(frozen=True)
class ToolSettings:
    """How the tools environment behaves (filled from ``ToolsEnvironment``)."""

    call_format: Literal["hermes", "tags"]
    on_error: Literal["reply", "end"]
    max_result_chars: int
    tool_timeout_s: float
    stop_after_call: bool


class ToolEnvironment:
    """Episodes in which the model calls ``tools``."""

    def __init__(self, tools: list[Tool], settings: ToolSettings) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"environment.tools: two tools share a name ({names})")
        self.tools = {t.name: t for t in tools}
        self.settings = settings
        self.tags = {t.tag: (t.name, t.argument) for t in tools}
        self.parallel_steps = all(getattr(t, "thread_safe", False) for t in tools)
        """Episodes may step in parallel threads (every tool says it is ``thread_safe``)."""
        if settings.stop_after_call:
            closers = (
                [HERMES_CLOSE]
                if settings.call_format == "hermes"
                else [f"</{t}>" for t in self.tags]
            )
            self.stop_strings = tuple(closers)

    def start(self, example: dict[str, Any]) -> ToolEpisode:
        return ToolEpisode(self)

    def parse(self, text: str) -> list[ParsedCall]:
        if self.settings.call_format == "hermes":
            return parse_hermes(text)
        return parse_tags(text, self.tags)


class ToolEpisode:
    """One episode of :class:`ToolEnvironment` (stateless between turns)."""

    def __init__(self, env: ToolEnvironment) -> None:
        self.env = env

    def step(self, model_text: str) -> EnvTurn:
        calls = self.env.parse(model_text)
        if not calls:
            return EnvTurn(message=None)
        counts = {"tool_calls": len(calls)}
        results: list[str] = []
        log: list[dict[str, Any]] = []
        failed = False
        for call in calls:
            outcome = self._run(call, counts)
            failed = failed or outcome.status != "ok"
            results.append(self._cut(outcome.text, counts))
            log.append(
                {
                    "call": call.raw if isinstance(call, MalformedCall) else _call_dict(call),
                    "status": outcome.status,
                    "result": results[-1],
                }
            )
        info = {"tool_calls": log}
        if failed and self.env.settings.on_error == "end":
            return EnvTurn(message=None, info=info, counts=counts)
        return EnvTurn(message=self._wrap(results), info=info, counts=counts)

    def _run(self, call: ParsedCall, counts: dict[str, int]) -> CallOutcome:
        if isinstance(call, MalformedCall):
            _add(counts, "malformed_calls")
            return CallOutcome("error", f"error: malformed tool call: {call.reason}")
        tool = self.env.tools.get(call.name)
        if tool is None:
            _add(counts, "unknown_tools")
            known = ", ".join(sorted(self.env.tools))
            return CallOutcome("error", f"error: unknown tool {call.name!r} (tools: {known})")
        outcome = call_tool(tool, call.arguments, self.env.settings.tool_timeout_s)
        if outcome.status != "ok":
            _add(counts, _FAILURE_COUNT[outcome.status])
        return outcome

    def _cut(self, text: str, counts: dict[str, int]) -> str:
        limit = self.env.settings.max_result_chars
        if len(text) <= limit:
            return text
        _add(counts, "results_cut")
        return text[:limit] + f"\n[cut: {len(text) - limit} more characters]"

    def _wrap(self, results: list[str]) -> str:
        if self.env.settings.call_format == "hermes":
            return "\n".join(f"<tool_response>\n{r.rstrip()}\n</tool_response>" for r in results)
        return "\n".join(r.strip() for r in results)


def _add(counts: dict[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1
    if name != "results_cut":
        counts["tool_errors"] = counts.get("tool_errors", 0) + 1


def _call_dict(call: Any) -> dict[str, Any]:
    return {"name": call.name, "arguments": call.arguments}
