"""The Responses API (``/v1/responses``) on the chat path: a request's ``instructions`` and input
items become a chat conversation, which the endpoint completes exactly as it completes
``/v1/chat/completions`` (the same token-exact episode record), and the answer is written back as
a ``response`` object with ``message`` and ``function_call`` output items.

Input items: a string (one user message), or a list of ``message`` items (roles ``user``,
``system``, ``developer`` (a system message), ``assistant``; content as a string or
``input_text`` / ``output_text`` parts), ``function_call`` items (the assistant's calls: merged
into the assistant message before them, as the endpoint answered them) and
``function_call_output`` items (``tool`` messages). ``reasoning`` items are skipped (the
endpoint sends none). ``previous_response_id`` continues the conversation of an earlier response
of the same episode: its input and output, then this request's input; ``instructions`` are not
carried over (each request's own are its system message), as in OpenAI's API.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from zbrl.rollout.endpoint.openai_api import RequestError


@dataclass(frozen=True)
class ResponsesRequest:
    """What a ``/v1/responses`` request asks for, read from its body."""

    instructions: str | None
    items: list[dict[str, Any]]
    """The input as chat messages (tool calls' arguments as JSON strings, as on the wire)."""
    previous_response_id: str | None
    tools: list[dict[str, Any]] | None
    """As chat tools (``{"type": "function", "function": {...}}``)."""
    body: dict[str, Any]

    def chat_body(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat completion request body of this request after ``history`` (the conversation
        of ``previous_response_id``, without its instructions)."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        out: dict[str, Any] = {"messages": [*system, *history, *self.items]}
        if self.tools:
            out["tools"] = self.tools
        for theirs, ours in (
            ("max_output_tokens", "max_tokens"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
        ):
            if self.body.get(theirs) is not None:
                out[ours] = self.body[theirs]
        return out


def read_responses_request(body: Any) -> ResponsesRequest:
    """A ``/v1/responses`` body read into chat terms; a RequestError naming the field when the
    endpoint cannot serve it."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("instructions must be a string")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise RequestError("previous_response_id must be a string")
    raw = body.get("input")
    if isinstance(raw, str):
        items = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        items = input_messages(raw)
    else:
        raise RequestError("input must be a string or a non-empty list of items")
    return ResponsesRequest(instructions, items, previous, _tools(body.get("tools")), body)


def input_messages(items: list[Any]) -> list[dict[str, Any]]:
    """Responses input items as chat messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RequestError(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(
                    f"input[{i}].role must be user, system, developer or assistant, not {role!r}"
                )
            role = "system" if role == "developer" else role
            out.append({"role": role, "content": _text(item.get("content"), f"input[{i}]")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _text(item.get("output"), f"input[{i}].output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind == "reasoning":
            continue
        else:
            raise RequestError(
                f"input[{i}]: items of type {kind!r} are not supported (message, function_call, "
                "function_call_output, reasoning are)"
            )
    return out


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text", "text"):
                raise RequestError(f"{where}: only text content parts are supported, not {kind!r}")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise RequestError(f"{where}: content must be a string or a list of text parts")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestError(f"tools[{i}]: only function tools are supported, not {kind!r}")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def response_object(chat: dict[str, Any], request: ResponsesRequest) -> dict[str, Any]:
    """The ``response`` object of a finished ``chat.completion`` answer ``chat``."""
    choice = chat["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    content = message.get("content") or ""
    if content or not message.get("tool_calls"):
        output.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": content, "annotations": []}],
            }
        )
    for call in message.get("tool_calls") or []:
        output.append(
            {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    body = request.body
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "model": chat["model"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "instructions": request.instructions,
        "previous_response_id": request.previous_response_id,
        "output": output,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def answered_message(chat: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a ``chat.completion`` answer, as the conversation continues
    with it (``previous_response_id``)."""
    message = dict(chat["choices"][0]["message"])
    if message.get("content") is None:
        message["content"] = ""
    return message


def history_of(stored: dict[str, list[dict[str, Any]]], previous: str | None) -> list[dict]:
    """The conversation of response ``previous`` (empty without one); a RequestError when the
    episode has no such response."""
    if previous is None:
        return []
    if previous not in stored:
        raise RequestError(
            f"previous_response_id {previous!r} is not a response of this episode (responses "
            "are kept per episode while it is open; under `zbrl serve` none are kept: send the "
            "whole input)",
            status=404,
            code="previous_response_not_found",
        )
    return json.loads(json.dumps(stored[previous]))  # a copy the request cannot change
