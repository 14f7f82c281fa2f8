"""Every check of a completion request's JSON body, in one place: the types and ranges of the
fields the endpoint reads, each refusal a :class:`~zbrl.rollout.endpoint.openai_api.RequestError`
(400) naming the field, what it got and what it takes.

Fields the endpoint does not read (``seed``, ``user``, ``logprobs``, ...) are not checked: OpenAI
clients send many of them. What is checked follows OpenAI's API reference: ``temperature`` a
number in [0, 2], ``top_p`` in (0, 1], ``max_tokens`` / ``max_completion_tokens`` a positive
integer, ``stop`` a string or a list of strings, ``n`` an integer (1 is the only one served),
``stream`` a boolean, ``tools`` a list of ``{"type": "function", "function": {"name": ...}}``,
``messages`` a non-empty list of objects with a known ``role`` whose ``content`` is a string,
null, or a list of content parts (only ``text`` parts: a model of this endpoint reads text).
"""

from __future__ import annotations

from typing import Any

from zbrl.rollout.endpoint.openai_api import RequestError

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""The message roles of OpenAI's chat API."""


def check_body(body: Any, *, chat: bool) -> None:
    """Refuse (RequestError 400) a body whose fields have the wrong type or range."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, not {_kind(body)}")
    _number(body, "temperature", low=0.0, high=2.0, low_open=False)
    _number(body, "top_p", low=0.0, high=1.0, low_open=True)
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < 1):
            raise RequestError(f"{name} must be a positive integer, not {value!r}")
    if "n" in body and body["n"] is not None and not _is_int(body["n"]):
        raise RequestError(f"n must be an integer, not {body['n']!r}")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise RequestError(f"stream must be true or false, not {body['stream']!r}")
    _stop(body.get("stop"))
    _tools(body.get("tools"))
    if chat:
        _messages(body.get("messages"))
    else:
        _prompt(body.get("prompt"))


def message_text(content: Any) -> str:
    """The text of a message's ``content`` that :func:`check_body` accepted: a string as it is,
    content parts joined, null as ``""``."""
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return "" if content is None else content


def _number(body: dict[str, Any], name: str, *, low: float, high: float, low_open: bool) -> None:
    value = body.get(name)
    if value is None:
        return
    bracket = "(" if low_open else "["
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise RequestError(f"{name} must be a number in {bracket}{low:g}, {high:g}], not {value!r}")
    if value > high or value < low or (low_open and value == low):
        raise RequestError(f"{name} must be in {bracket}{low:g}, {high:g}], not {value!r}")


def _stop(stop: Any) -> None:
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(
            f"stop must be a string or a list of non-empty strings, not {_short(stop)}"
        )


def _tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise RequestError(f"tools must be a list of tool objects, not {_kind(tools)}")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(
                f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                f'"parameters": ...}}}}, not {_short(tool)}'
            )
        if tool.get("type", "function") != "function":
            raise RequestError(f'tools[{i}].type must be "function", not {tool["type"]!r}')


def _messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise RequestError(f"messages must be a non-empty list, not {_short(messages)}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object, not {_kind(m)}")
        if m.get("role") not in ROLES:
            raise RequestError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, not {m.get('role')!r}"
            )
        _content(m.get("content"), f"messages[{i}].content")
        calls = m.get("tool_calls")
        if calls is not None:
            _tool_calls(calls, f"messages[{i}].tool_calls")


def _content(content: Any, where: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise RequestError(
            f"{where} must be a string or a list of content parts, not {_kind(content)}"
        )
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else _kind(part)
            raise RequestError(
                f'{where}[{j}] must be a text part ({{"type": "text", "text": ...}}), not '
                f"{kind!r}: this endpoint serves a text model"
            )
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{where}[{j}].text must be a string")


def _tool_calls(calls: Any, where: str) -> None:
    if not isinstance(calls, list):
        raise RequestError(f"{where} must be a list, not {_kind(calls)}")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{where}[{j}] must have a function with a string name")
        if not isinstance(fn.get("arguments", "{}"), str | dict):
            raise RequestError(f"{where}[{j}].function.arguments must be a JSON string")


def _prompt(prompt: Any) -> None:
    ok_ids = isinstance(prompt, list) and all(_is_int(t) and t >= 0 for t in prompt)
    if not (isinstance(prompt, str) or ok_ids) or not prompt:
        raise RequestError(
            f"prompt must be a non-empty string or list of token ids, not {_short(prompt)}"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
