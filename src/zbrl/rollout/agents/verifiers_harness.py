"""The verifiers harness zbrl plays the policy with: an in-process chat loop with the task's tools.

A verifiers harness is the program that plays a task; every model call it makes goes through the
episode's interception server (``endpoint`` with bearer ``secret``), which verifiers forwards to
the model (here zbrl's endpoint) and records on the trace. verifiers' own harnesses are programs
that ``uv`` installs and that stream; :class:`ChatHarness` runs in the episode's event loop
instead (verifiers allows it: "the interception is the contract, not the process") and sends
plain, non-streaming chat requests, which the endpoint answers token-exact.

Tools: in verifiers 0.4 a taskset declares its tools as ``Toolset`` MCP servers (``Task.toolsets``
per episode, ``Taskset.toolsets`` shared by the taskset's tasks); verifiers starts them and hands
the harness their URLs (``mcp_urls``). :class:`ChatHarness` lists their tools, sends them with
every request (``tools``), runs the model's ``tool_calls`` on the servers and answers each with a
``tool`` message, then asks again, until a reply calls no tool (the answer), the endpoint ends the
episode (``environment.limits``), or ``max_turns`` replies. The conversation it re-sends is the
one the endpoint saw: every assistant message exactly as the endpoint answered it (its JSON, not
a re-serialised copy), so the endpoint reuses the episode's tokens instead of refusing a changed
history. Tool failures (malformed arguments, an unknown tool, a tool error or timeout) become the
``tool`` message's ``error: ...`` text and are counted on the trace's metrics (:data:`COUNTS`).

A taskset uses it by exporting it next to its ``Taskset`` in ``__all__`` (verifiers then takes it
as the taskset's bundled harness), or a run names a harness module with ``environment.harness``.

In a zbrl run every model request names its episode with the ``X-Zbrl-Episode`` header
(:func:`episode_headers`), which verifiers forwards to the endpoint: verifiers' own client
carries one key for all episodes (see :mod:`zbrl.rollout.agents.verifiers_agent`).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from contextvars import ContextVar
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from zbrl.rollout.endpoint.openai_api import EPISODE_HEADER

__all__ = ["ChatHarness", "ChatHarnessConfig"]

EPISODE_KEY: ContextVar[str | None] = ContextVar("zbrl_episode_key", default=None)
"""The key of the zbrl episode the running task plays (set by zbrl's verifiers agent around
``Env.run_episode``; every episode runs in a task of its own, so each sees only its own)."""


def episode_headers() -> dict[str, str]:
    """The header naming the running task's zbrl episode (none outside a zbrl run): an
    in-process harness sends it with every model request."""
    key = EPISODE_KEY.get()
    return {EPISODE_HEADER: key} if key else {}


COUNTS = (
    "tool_calls",
    "tool_errors",
    "malformed_calls",
    "unknown_tools",
    "tool_failures",
    "tool_timeouts",
)
"""The events the harness counts on the trace (``trace.metrics``): calls made, and failures in
all (``tool_errors``) and by kind. zbrl reports them as ``env/<name>``."""


class ChatHarnessConfig(vf.HarnessConfig):
    max_turns: int = Field(16, ge=1)
    """Model replies per episode at most (a zbrl run's ``environment.limits.max_turns`` ends an
    episode at the endpoint first when it is lower)."""


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """The task's prompt (its system prompt first) as a chat, with the task's MCP tools: the
    answer is the trace's last assistant message, which the task's rewards score."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    NEEDS_CONTAINER = False
    EXECUTES_CODE = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> vf.ProgramResult:
        import openai

        messages = self._messages(data)
        counts = dict.fromkeys(COUNTS, 0)
        async with AsyncExitStack() as stack:
            tools = await Tools.connect(mcp_urls, self.config.tool_timeout, stack)
            client = await stack.enter_async_context(
                openai.AsyncOpenAI(
                    base_url=endpoint,
                    api_key=secret,
                    max_retries=0,
                    default_headers=episode_headers(),
                )
            )
            for _ in range(self.config.max_turns):
                kwargs = {"tools": tools.schemas} if tools.schemas else {}
                raw = await client.chat.completions.with_raw_response.create(
                    model=ctx.model, messages=messages, **kwargs
                )
                # the assistant message exactly as the endpoint sent it (see the module docstring)
                message = json.loads(raw.http_response.content)["choices"][0]["message"]
                messages.append(message)
                calls = message.get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    messages.append(await tools.answer(call, counts))
        trace.record_metrics(counts)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    def _messages(self, data: vf.TaskData) -> list[dict[str, Any]]:
        system_prompt, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = []
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(mode="json", exclude_none=True) for m in prompt or []]
        return messages


class Tools:
    """The task's MCP tools for one episode: their OpenAI schemas, and the calls that run them."""

    def __init__(self, schemas: list[dict[str, Any]], dispatch: dict, servers: dict, timeout_s):
        self.schemas = schemas
        self._dispatch = dispatch
        self._servers = servers
        self._timeout_s = timeout_s

    @classmethod
    async def connect(cls, mcp_urls: dict[str, str], timeout_s: float, stack: AsyncExitStack):
        """The tools of the servers at ``mcp_urls`` (none: no tools), connected for the episode
        (closed with ``stack``)."""
        if not mcp_urls:
            return cls([], {}, {}, timeout_s)
        from verifiers.v1.harnesses.utils.mcp import connect_mcp

        spec = {"mcpServers": {n: {"url": u, "timeout": timeout_s} for n, u in mcp_urls.items()}}
        schemas, dispatch, servers = await connect_mcp(spec, stack)
        return cls(schemas, dispatch, servers, timeout_s)

    async def answer(self, call: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
        """The ``tool`` message answering ``call`` (an OpenAI tool call), counted."""
        counts["tool_calls"] += 1
        fn = call.get("function") or {}
        text, failure = await self._run(fn.get("name") or "", fn.get("arguments"))
        if failure:
            counts[failure] += 1
            counts["tool_errors"] += 1
        return {"role": "tool", "tool_call_id": call.get("id", ""), "content": text}

    async def _run(self, name: str, arguments: Any) -> tuple[str, str | None]:
        from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content

        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as e:
            return f"error: the arguments are not JSON ({e})", "malformed_calls"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object", "malformed_calls"
        if name not in self._dispatch:
            known = ", ".join(sorted(self._dispatch)) or "none"
            return f"error: unknown tool {name!r} (tools: {known})", "unknown_tools"
        server, tool = self._dispatch[name]
        try:
            result = await asyncio.wait_for(
                self._servers[server].run(lambda client: client.call_tool(tool, args)),
                self._timeout_s,
            )
        except TimeoutError:
            return f"error: the tool {name!r} timed out after {self._timeout_s} s", "tool_timeouts"
        except Exception as e:  # the server failed the call: the model reads why
            return f"error: {type(e).__name__}: {e}", "tool_failures"
        content = mcp_content_to_chat_content(result.content)
        text = content if isinstance(content, str) else json.dumps(content)
        if result.is_error:
            return f"error: {text}", "tool_failures"
        return text, None
