"""Server-sent events synthesized from a finished answer.

The endpoint generates a call's whole completion in one backend batch, then writes it back. A
request with ``stream: true`` gets the same answer as events: a ``chat.completion.chunk`` per
piece of the content (and per tool call, as OpenAI's ``tool_calls`` deltas), a final chunk with
the ``finish_reason``, a ``usage`` chunk when ``stream_options.include_usage`` asks for one, then
``data: [DONE]``; ``text_completion`` answers stream the same way, and Responses API answers as
its typed events (``response.created`` ... ``response.completed``). What is recorded and trained
is what the non-streaming answer records: streaming only changes how the answer is written.
"""

from __future__ import annotations

import json
import re
from typing import Any

DONE = b"data: [DONE]\n\n"

_PIECE = re.compile(r"\s*\S+\s*|\s+")
"""A word and the whitespace around it: the content's pieces, one chunk each, joined back
losslessly."""


def pieces(text: str) -> list[str]:
    """``text`` cut into word pieces that join back to it exactly."""
    return _PIECE.findall(text)


def stream_options(body: Any) -> tuple[bool, bool]:
    """Whether a request body asks for streaming, and for a ``usage`` chunk at the end."""
    if not isinstance(body, dict) or body.get("stream") is not True:
        return False, False
    options = body.get("stream_options") or {}
    return True, isinstance(options, dict) and options.get("include_usage") is True


def event_stream(payload: dict[str, Any], include_usage: bool) -> bytes:
    """The server-sent events of a finished answer ``payload`` (a ``chat.completion``,
    ``text_completion`` or ``response`` object)."""
    kind = payload.get("object")
    if kind == "chat.completion":
        return _data(chat_chunks(payload, include_usage)) + DONE
    if kind == "text_completion":
        return _data(text_chunks(payload, include_usage)) + DONE
    if kind == "response":
        return b"".join(
            f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
            for e in response_events(payload)
        )
    raise ValueError(f"no event stream for a {kind!r} answer")


def _data(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks)


def chat_chunks(payload: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """``chat.completion.chunk`` objects whose deltas add up to ``payload``'s message."""
    choice = payload["choices"][0]
    message = choice["message"]
    head = {k: payload[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    usage = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        c = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**head, "choices": [c], **usage}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in pieces(message.get("content") or "")]
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        opening = {"index": i, "id": call["id"], "type": "function"}
        opening["function"] = {"name": fn["name"], "arguments": ""}
        chunks.append(chunk({"tool_calls": [opening]}))
        arguments = {"index": i, "function": {"arguments": fn["arguments"]}}
        chunks.append(chunk({"tool_calls": [arguments]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": payload["usage"]})
    return chunks


def text_chunks(payload: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """``text_completion`` chunks whose texts add up to ``payload``'s text."""
    choice = payload["choices"][0]
    head = {k: payload[k] for k in ("id", "object", "created", "model")}
    usage = {"usage": None} if include_usage else {}

    def chunk(text: str, finish: str | None = None) -> dict[str, Any]:
        c = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return {**head, "choices": [c], **usage}

    chunks = [chunk(p) for p in pieces(choice["text"])]
    chunks.append(chunk("", choice["finish_reason"]))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": payload["usage"]})
    return chunks


def response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The Responses API's events for a finished ``response`` object: created, in progress, each
    output item added / its deltas / done, completed (or incomplete), numbered in order."""
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for index, item in enumerate(response["output"]):
        events += _item_events(index, item)
    final = "response.completed" if response["status"] == "completed" else "response.incomplete"
    events.append({"type": final, "response": response})
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        opened = {**item, "arguments": "", "status": "in_progress"}
        return [
            {"type": "response.output_item.added", "output_index": index, "item": opened},
            {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "content": [], "status": "in_progress"},
        }
    ]
    for part_index, part in enumerate(item["content"]):
        where = {**at, "content_index": part_index}
        empty = {**part, "text": ""}
        events.append({"type": "response.content_part.added", **where, "part": empty})
        events += [
            {"type": "response.output_text.delta", **where, "delta": p, "logprobs": []}
            for p in pieces(part["text"])
        ]
        events.append(
            {"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []}
        )
        events.append({"type": "response.content_part.done", **where, "part": part})
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events
