"""The verifiers harness zbrl plays the policy with: an in-process chat loop.

A verifiers harness is the program that plays a task; every model call it makes goes through the
episode's interception server (``endpoint`` with bearer ``secret``), which verifiers forwards to
the model (here zbrl's endpoint) and records on the trace. verifiers' own harnesses are programs
that ``uv`` installs and that stream; :class:`ChatHarness` runs in the episode's event loop
instead (verifiers allows it: "the interception is the contract, not the process") and sends
plain, non-streaming chat requests, which the endpoint answers token-exact.

A taskset uses it by exporting it next to its ``Taskset`` in ``__all__`` (verifiers then takes it
as the taskset's bundled harness), or a run names a harness module with ``environment.harness``.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf

__all__ = ["ChatHarness"]


class ChatHarness(vf.Harness[vf.HarnessConfig]):
    """One chat completion of the task's prompt (its system prompt first): the answer is the
    trace's last assistant message, which the task's rewards score."""

    APPENDS_SYSTEM_PROMPT = True
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

        system_prompt, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = []
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(mode="json", exclude_none=True) for m in prompt or []]
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")
