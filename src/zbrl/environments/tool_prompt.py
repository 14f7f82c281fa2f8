"""What the model is told about its tools: each tool's name, description and argument schema.

A chat template that renders tools (Qwen2.5's and most templates with tools) gets them as
``tools=`` in the form it expects, ``[{"type": "function", "function": {"name", "description",
"parameters"}}]``, and writes them (and its own call instructions) into the prompt. A template
that does not (SmolLM2's, the embedded model's) gets the same facts as a section of the system
prompt, which also shows the call format the environment parses. Which of the two is decided
once per tokenizer by rendering with the tools: a template renders them when every tool's
description appears in its text. ``tools=`` is used only with the ``hermes`` call format (the
one such templates teach); ``tags`` always uses the system-prompt section.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from zbrl.environments.tool_calls import HERMES_CLOSE, HERMES_OPEN
from zbrl.environments.tools import Tool

PROBE = [{"role": "user", "content": "What is 2+2?"}]
"""The conversation a template is rendered with to see whether it writes the tools."""


def tool_schema(tool: Tool) -> dict[str, Any]:
    """``tool`` as chat templates with tools take it (the OpenAI function form)."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def tools_section(tools: Sequence[Tool], call_format: Literal["hermes", "tags"]) -> str:
    """The system-prompt section describing ``tools`` and how to call them in ``call_format``."""
    lines = ["You can call these tools:"]
    if call_format == "hermes":
        for t in tools:
            lines.append(f"- {t.name}: {t.description} Arguments: {json.dumps(t.parameters)}")
        example = json.dumps({"name": "TOOL_NAME", "arguments": {"ARGUMENT": "VALUE"}})
        lines += [
            f"To call a tool, write {HERMES_OPEN}{example}{HERMES_CLOSE}; its result comes back "
            "in <tool_response></tool_response>. Answer without a call when you are done.",
        ]
    else:
        for t in tools:
            lines.append(
                f"- {t.name}: {t.description} Call it with <{t.tag}>{t.argument}</{t.tag}>."
            )
        lines.append("Its result comes back as the next message. Answer without a call when done.")
    return "\n".join(lines)


@dataclass(frozen=True)
class ToolPrompt:
    """How a run's prompts tell the model about its tools (one of the two is set)."""

    tools: list[dict[str, Any]] | None
    """Passed as ``tools=`` to ``apply_chat_template`` (a template that renders tools)."""
    system_section: str | None
    """Added to the system prompt (a template that does not)."""


def renders_tools(tokenizer: Any, schemas: list[dict[str, Any]]) -> bool:
    """Whether ``tokenizer``'s chat template writes every tool's description when given
    ``tools=`` (a template that ignores or refuses them does not)."""
    try:
        text = tokenizer.apply_chat_template(
            PROBE, tools=schemas, add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that refuses the argument renders no tools
        return False
    return all(s["function"]["description"] in text for s in schemas)


def tool_prompt(
    tokenizer: Any, tools: Sequence[Tool], call_format: Literal["hermes", "tags"]
) -> ToolPrompt:
    """The way ``tokenizer``'s template is told about ``tools`` (see the module's docstring)."""
    schemas = [tool_schema(t) for t in tools]
    if call_format == "hermes" and renders_tools(tokenizer, schemas):
        return ToolPrompt(schemas, None)
    return ToolPrompt(None, tools_section(tools, call_format))
