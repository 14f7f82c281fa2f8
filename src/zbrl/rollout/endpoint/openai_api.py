"""The OpenAI wire format: request bodies read into what the endpoint needs, and completions
written back as ``chat.completion`` / ``text_completion`` objects (with ``usage``, and Hermes-style
``<tool_call>`` blocks as ``tool_calls`` when the request declared ``tools``)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from zbrl.environments.tool_calls import HERMES_CLOSE, HERMES_OPEN, ToolCall, parse_hermes

EPISODE_HEADER = "X-Zbrl-Episode"
"""A request header naming its episode by key, for a client whose ``Authorization`` cannot carry
the episode's key (verifiers' client: one per endpoint, its key fixed); it wins over the bearer
key."""


class RequestError(ValueError):
    """A request the endpoint refuses; ``status`` is its HTTP status, ``code`` the error code."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Request:
    """What a completion request asks for."""

    messages: list[dict[str, Any]] | None
    """Chat requests: the conversation (contents as plain text)."""
    prompt: str | list[int] | None
    """Completion requests: the prompt, as text or token ids."""
    tools: list[dict[str, Any]] | None
    max_tokens: int | None
    stop: tuple[str, ...]
    temperature: float | None
    top_p: float | None


def read_request(body: Any, *, chat: bool) -> Request:
    """The request of a JSON ``body``; a body the endpoint cannot serve is a RequestError."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if not isinstance(body.get("stream", False), bool):
        raise RequestError("stream must be true or false")
    if body.get("n") not in (None, 1):
        raise RequestError("n must be 1 (one completion per request)")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError("max_tokens must be a positive integer")
    messages = prompt = None
    if chat:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise RequestError("messages must be a non-empty list")
        messages = [_message(m, i) for i, m in enumerate(raw)]
    else:
        prompt = body.get("prompt")
        ok_ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        if not (isinstance(prompt, str) or ok_ids) or not prompt:
            raise RequestError("prompt must be a non-empty string or list of token ids")
    tools = body.get("tools") or None
    return Request(
        messages,
        prompt,
        tools,
        max_tokens,
        stop,
        body.get("temperature"),
        body.get("top_p"),
    )


def _message(m: Any, index: int) -> dict[str, Any]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise RequestError(f"messages[{index}] must be an object with a string role")
    out = dict(m)
    content = m.get("content")
    if isinstance(content, list):  # content parts: the text parts joined
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out["content"] = "" if content is None else str(content)
    if m.get("tool_calls"):
        out["tool_calls"] = [_tool_call_for_template(c) for c in m["tool_calls"]]
    return out


def _tool_call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    """A client's tool call with its arguments as an object (what chat templates render)."""
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except json.JSONDecodeError:
            raise RequestError(f"tool call arguments are not JSON: {args!r}") from None
    return {**call, "function": fn}


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two messages say the same (role, content, tool calls by name and arguments, tool
    call id); call ids of the assistant's own calls are not compared."""

    def key(m: dict[str, Any]) -> tuple[Any, ...]:
        calls = [
            (c["function"].get("name"), json.dumps(c["function"].get("arguments"), sort_keys=True))
            for c in m.get("tool_calls") or []
        ]
        return (m["role"], m.get("content") or "", calls, m.get("tool_call_id"))

    return key(a) == key(b)


def assistant_message(text: str, parse_tools: bool) -> dict[str, Any]:
    """The assistant message of a completion's ``text``: with ``parse_tools``, its well-formed
    ``<tool_call>`` blocks become ``tool_calls`` (arguments as objects) and leave the content."""
    calls = [c for c in parse_hermes(text) if isinstance(c, ToolCall)] if parse_tools else []
    if not calls:
        return {"role": "assistant", "content": text}
    content = text.split(HERMES_OPEN, 1)[0].rstrip()
    tail = text.rsplit(HERMES_CLOSE, 1)[-1].strip()
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for c in calls
    ]
    return {"role": "assistant", "content": content + tail, "tool_calls": tool_calls}


def chat_response(
    model: str, message: dict[str, Any], finish: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A ``chat.completion`` object (tool-call arguments as JSON strings, as OpenAI sends)."""
    wire = dict(message)
    if message.get("tool_calls"):
        wire["tool_calls"] = [_wire_call(c) for c in message["tool_calls"]]
        finish = "tool_calls" if finish == "stop" else finish
    choice = {"index": 0, "message": wire, "finish_reason": finish, "logprobs": None}
    return _completion(
        "chatcmpl", "chat.completion", model, choice, prompt_tokens, completion_tokens
    )


def _wire_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    return {**call, "function": {**fn, "arguments": json.dumps(fn["arguments"])}}


def text_response(
    model: str, text: str, finish: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A ``text_completion`` object."""
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return _completion("cmpl", "text_completion", model, choice, prompt_tokens, completion_tokens)


def _completion(
    id_prefix: str,
    kind: str,
    model: str,
    choice: dict[str, Any],
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A completion object of ``kind`` with its one ``choice`` (a fresh id, the time, usage)."""
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def models_response(model: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": 0, "owned_by": "zbrl"}],
    }


def error_body(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
