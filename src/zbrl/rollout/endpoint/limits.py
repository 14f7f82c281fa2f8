"""The endpoint's limits, checked before the model runs: a request's prompt plus its
``max_tokens`` must fit the model's context, else it is refused with 400
``context_length_exceeded`` naming both numbers (as OpenAI's API answers).

The context is ``rollout.backend.max_model_len`` when the backend serves a bounded length, else
the model config's positions (``max_position_embeddings``); a backend that knows neither leaves
it to the episode's ``max_total_tokens`` (during a run) and checks nothing here.

Counting a prompt's tokens means rendering and tokenizing it, which for a huge body costs more
than the answer is worth: a lower bound comes first. No token of the tokenizer is longer than its
longest vocabulary entry (in characters: a byte-level entry has one character per byte, a
SentencePiece one per character, so the decoded text of a token is never longer), so text of
``c`` characters needs at least ``c / longest`` tokens. A request whose messages alone pass the
context by that bound is refused without being rendered.
"""

from __future__ import annotations

import math
from typing import Any

from zbrl.rollout.endpoint.openai_api import Request, RequestError
from zbrl.rollout.endpoint.validation import message_text


def longest_token_chars(tokenizer: Any) -> int:
    """The longest vocabulary entry of ``tokenizer``, in characters (at least 1)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1) or 1


def request_chars(request: Request) -> int:
    """Characters of text the request brings (message contents, or a text prompt)."""
    if request.messages is not None:
        return sum(len(message_text(m.get("content"))) for m in request.messages)
    return len(request.prompt) if isinstance(request.prompt, str) else 0


def check_size_bound(request: Request, context_len: int | None, longest: int) -> None:
    """Refuse a request whose text needs more tokens than the context by the lower bound of the
    module docstring (before anything is rendered)."""
    if context_len is None:
        return
    chars = request_chars(request)
    at_least = math.ceil(chars / longest)
    if isinstance(request.prompt, list):
        at_least = len(request.prompt)
    if at_least > context_len:
        raise _exceeded(
            context_len,
            f"your prompt is at least {at_least} tokens ({chars} characters, at most "
            f"{longest} characters a token)"
            if not isinstance(request.prompt, list)
            else f"your prompt is {at_least} tokens",
            at_least,
            request.max_tokens,
        )


def check_context(n_prompt: int, max_tokens: int | None, context_len: int | None) -> None:
    """Refuse a prompt of ``n_prompt`` tokens (after the chat template) that leaves no room for
    ``max_tokens`` (None: for one token) in ``context_len``."""
    if context_len is None:
        return
    if n_prompt + (max_tokens or 1) > context_len:
        raise _exceeded(
            context_len, f"you requested {n_prompt} tokens in the prompt", n_prompt, max_tokens
        )


def room(n_prompt: int, context_len: int | None) -> int | None:
    """Tokens the context leaves after a prompt of ``n_prompt`` (None: unbounded)."""
    return None if context_len is None else context_len - n_prompt


def _exceeded(
    context_len: int, prompt_part: str, n_prompt: int, max_tokens: int | None
) -> RequestError:
    completion = (
        f" and {max_tokens} in the completion (max_tokens), {n_prompt + max_tokens} in all"
        if max_tokens is not None
        else ""
    )
    return RequestError(
        f"This model's maximum context length is {context_len} tokens. However, {prompt_part}"
        f"{completion}. Please reduce the length of the messages or the completion.",
        status=400,
        code="context_length_exceeded",
    )
