"""Tool calls parsed from a model turn's text, in one of two documented formats.

``hermes`` (the tool-call format of Qwen's, Hermes' and most chat templates with tools)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "123*456"}}
    </tool_call>

``tags`` (for models without a tool-call format, e.g. the embedded character-level model): the
tool's tag around its single argument, ``<calc>123*456</calc>``.

A turn may hold several calls; they run in order. Text that opens a call but does not close it, a
body that is not a JSON object with a string ``name`` and an object ``arguments``, is a
:class:`MalformedCall` (answered with an error, never raised).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedCall:
    """A call that could not be read; ``reason`` is what the model is told."""

    reason: str
    raw: str


ParsedCall = ToolCall | MalformedCall


def parse_hermes(text: str) -> list[ParsedCall]:
    """Every ``<tool_call>…</tool_call>`` in ``text``, in order."""
    out: list[ParsedCall] = []
    pos = 0
    while (start := text.find(HERMES_OPEN, pos)) >= 0:
        body_start = start + len(HERMES_OPEN)
        end = text.find(HERMES_CLOSE, body_start)
        if end < 0:
            out.append(
                MalformedCall(f"{HERMES_OPEN} is never closed by {HERMES_CLOSE}", text[start:])
            )
            break
        out.append(_hermes_body(text[body_start:end]))
        pos = end + len(HERMES_CLOSE)
    return out


def _hermes_body(body: str) -> ParsedCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return MalformedCall(f"the call is not valid JSON ({e.msg} at char {e.pos})", body)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return MalformedCall('the call must be a JSON object with a string "name"', body)
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return MalformedCall('"arguments" is a string that is not JSON', body)
    if not isinstance(args, dict):
        return MalformedCall('"arguments" must be a JSON object', body)
    return ToolCall(obj["name"], args)


def parse_tags(text: str, tags: dict[str, tuple[str, str]]) -> list[ParsedCall]:
    """Every ``<TAG>body</TAG>`` for the tags of ``tags`` (tag -> (tool name, argument name)), in
    order; the body is the tool's single argument."""
    if not tags:
        return []
    opener = re.compile("<(" + "|".join(re.escape(t) for t in tags) + ")>")
    out: list[ParsedCall] = []
    pos = 0
    while (m := opener.search(text, pos)) is not None:
        tag = m.group(1)
        close = f"</{tag}>"
        end = text.find(close, m.end())
        if end < 0:
            out.append(MalformedCall(f"<{tag}> is never closed by {close}", text[m.start() :]))
            break
        name, argument = tags[tag]
        out.append(ToolCall(name, {argument: text[m.end() : end]}))
        pos = end + len(close)
    return out
