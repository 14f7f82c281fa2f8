"""One episode's tokens, kept exactly as the policy saw and wrote them.

The first request of an episode is rendered with the run's chat template and tokenized: those are
its prompt ids. Every completion appends the ids the policy sampled, with their log-probs and
version. A later request must re-send the conversation so far: the messages already seen, then
the assistant message the endpoint answered with (compared by role, content and tool calls), then
new messages. Those are reused as tokens, never rendered again; only the new messages are
rendered (the template's text that the full conversation adds to the conversation so far, after
the end of the assistant turn the model did not generate itself — :meth:`TurnFormatter.bridge`)
and tokenized once. A ``/v1/completions`` prompt must start with the text of the tokens so far
(or, given as token ids, with those ids). A request that changes what came before (edited or
dropped messages, other ``tools``, a template that rewrites earlier turns) is refused with
``prefix_mismatch`` and counted: zbrl never re-tokenizes a conversation behind the trainer's back.

With ``on_history_change: segment`` such a request instead closes the episode's segment (what it
rendered and generated so far, kept as it is) and starts the next one: the request is rendered
afresh, as an episode's first request is, and its completions append to it. Each segment is
trained as a sequence of its own (its prompt, its response, its loss mask and versions); the
episode's reward is every segment's (docs/agents.md, Changed histories).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from zbrl.rollout.endpoint.calls import Generated
from zbrl.rollout.endpoint.openai_api import RequestError, same_message
from zbrl.rollout.turns import TurnFormatter


class Renderer:
    """The run's chat template and tokenizer, as the endpoint uses them."""

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.formatter = TurnFormatter(tokenizer, "user", eos_ids=eos_ids)

    def render(self, messages: list[dict[str, Any]], tools: Any, *, generation_prompt: bool) -> str:
        kwargs = {"tools": tools} if tools else {}
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
            )
        except Exception as e:
            raise RequestError(
                f"the chat template cannot render these messages ({type(e).__name__}: {e})"
            ) from None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], *, skip_special: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)


@dataclass
class TokenSegment:
    """A stretch of an episode rendered from one request and continued token-exact: its ids
    (``prompt_len`` of them its prompt), mask, log-probs, versions and calls."""

    ids: list[int]
    mask: list[bool]
    logprobs: list[float]
    versions: list[int]
    prompt_len: int
    calls: list[dict[str, Any]]


@dataclass
class ConversationTokens:
    """Everything an episode's calls rendered and generated, in order (see the module
    docstring). ``ids`` start with the first request's prompt; ``mask`` is True on the tokens the
    policy generated, ``logprobs`` and ``versions`` are theirs (0 / the previous token's version
    on rendered tokens)."""

    renderer: Renderer
    ids: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_len: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Per call: ``prompt_tokens``, ``completion_ids``, ``logprobs``, ``version``, ``text``,
    ``finish_reason``, ``tool_calls`` (as the endpoint answered)."""
    counts: dict[str, int] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None
    tools: Any = None
    last_model_ids: list[int] = field(default_factory=list)
    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """``/v1/responses`` answers by id: the conversation each continues (without instructions;
    ``previous_response_id``)."""
    ended: bool = False
    """Past a limit: the episode is over (truncated); later calls get an empty answer."""
    segment_on_change: bool = False
    """A request that changes the history starts a new segment (True) or is refused (False)."""
    active_at: float = field(default_factory=time.monotonic)
    """When the episode last made a request or got an answer (``time.monotonic``)."""
    closed: list[TokenSegment] = field(default_factory=list)
    """The episode's earlier segments; the fields above are its current one."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def chat_context(self, messages: list[dict[str, Any]], tools: Any) -> list[int]:
        """The context ids of a chat request (appending what it adds); a changed prefix starts
        a new segment or is refused."""
        if self.ids:
            changed, text = self._chat_continuation(messages, tools)
            if changed is None:
                self._append_rendered(self.renderer.encode(text))
            else:
                self._change(changed)
        if not self.ids:
            self._append_rendered(self.renderer.encode(self._render(messages, tools, True)))
            self.prompt_len = len(self.ids)
        self.messages, self.tools = list(messages), tools
        return list(self.ids)

    def _chat_continuation(
        self, messages: list[dict[str, Any]], tools: Any
    ) -> tuple[str | None, str]:
        """(None, the text the request adds) when it continues the conversation so far, else
        (why not, "")."""
        seen = self.messages
        if seen is None or tools != self.tools:
            return "the tools or the kind of request changed within the episode", ""
        k = len(seen)
        if len(messages) <= k or not all(
            same_message(a, b) for a, b in zip(seen, messages[:k], strict=False)
        ):
            return (
                "the messages do not start with the conversation so far (every earlier "
                "message and the assistant's answers as the endpoint sent them)",
                "",
            )
        full = self._render(messages, tools, True)
        before = self._render(messages[:k], tools, False)
        if not full.startswith(before):
            return "the chat template rewrites earlier turns when messages are added", ""
        return None, self.renderer.formatter.bridge(self.last_model_ids) + full[len(before) :]

    def text_context(self, prompt: str | list[int]) -> list[int]:
        """The context ids of a completion request (appending what it adds); a prompt that does
        not continue the tokens so far starts a new segment or is refused."""
        if self.ids:
            changed = self._text_change(prompt)
            if changed is not None:
                self._change(changed)
        if isinstance(prompt, list):
            new = prompt[len(self.ids) :]
        else:
            seen = self.renderer.decode(self.ids, skip_special=False) if self.ids else ""
            new = self.renderer.encode(prompt[len(seen) :])
        if not self.ids:
            self.prompt_len = len(new)
        self._append_rendered(new)
        return list(self.ids)

    def _text_change(self, prompt: str | list[int]) -> str | None:
        if self.messages is not None:
            return "a completion request in a chat episode"
        if isinstance(prompt, list):
            if prompt[: len(self.ids)] != self.ids:
                return "the prompt ids do not start with the episode's ids so far"
        elif not prompt.startswith(self.renderer.decode(self.ids, skip_special=False)):
            return "the prompt does not start with the episode's text so far"
        return None

    def _change(self, why: str) -> None:
        """A request that changes the history: the current segment closes and the request
        starts the next (``segment_on_change``), or it is refused."""
        if not self.segment_on_change:
            self._mismatch(why)
        self.closed.append(self.current_segment())
        self.ids, self.mask, self.logprobs, self.versions = [], [], [], []
        self.prompt_len, self.calls, self.messages, self.tools = 0, [], None, None
        self.last_model_ids = []

    def current_segment(self) -> TokenSegment:
        return TokenSegment(
            self.ids, self.mask, self.logprobs, self.versions, self.prompt_len, self.calls
        )

    def segments(self) -> list[TokenSegment]:
        """The episode's segments in order; the current one unless it has no call (a request
        that started a segment and was answered by a limit)."""
        current = [self.current_segment()] if self.calls or not self.closed else []
        return self.closed + current

    def calls_made(self) -> int:
        """Completion calls of the episode, every segment's."""
        return sum(len(s.calls) for s in self.closed) + len(self.calls)

    def tokens_used(self) -> int:
        """Tokens the episode holds after its prompts: every segment's after its own prompt
        (what ``max_total_tokens`` bounds)."""
        done = sum(len(s.ids) - s.prompt_len for s in self.closed)
        return done + len(self.ids) - self.prompt_len

    def record(self, generated: Generated, answer: dict[str, Any] | None) -> None:
        """Append a completion; ``answer``: the assistant message sent back (chat requests)."""
        c = generated.completion
        ids = c.token_ids.tolist()
        versions = c.versions.tolist() if c.versions is not None else [generated.version] * len(ids)
        self.calls.append(
            {
                "prompt_tokens": len(self.ids),
                "completion_ids": ids,
                "logprobs": c.logprobs.tolist(),
                "version": generated.version,
                "text": c.text,
                "finish_reason": c.finish_reason,
                "tool_calls": (answer or {}).get("tool_calls"),
            }
        )
        self.ids += ids
        self.mask += [True] * len(ids)
        self.logprobs += c.logprobs.tolist()
        self.versions += versions
        self.last_model_ids = ids
        if answer is not None and self.messages is not None:
            self.messages.append(answer)

    def mark(self) -> tuple[int, int, list[dict[str, Any]] | None, Any]:
        """Where the episode is now, for :meth:`rollback`."""
        return len(self.ids), self.prompt_len, self.messages, self.tools

    def rollback(self, mark: tuple[int, int, list[dict[str, Any]] | None, Any]) -> None:
        """Undo what a refused request appended since :meth:`mark`."""
        n, self.prompt_len, self.messages, self.tools = mark
        self.cut(n)

    def cut(self, n: int) -> None:
        """Drop everything after the first ``n`` ids (rendered tokens not to keep)."""
        del self.ids[n:], self.mask[n:], self.logprobs[n:], self.versions[n:]

    def _render(self, messages: list[dict[str, Any]], tools: Any, gen: bool) -> str:
        return self.renderer.render(messages, tools, generation_prompt=gen)

    def _append_rendered(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [self.versions[-1] if self.versions else 0] * len(ids)

    def _mismatch(self, why: str) -> None:
        self.count("prefix_mismatches")
        raise RequestError(
            f"{why}; zbrl trains the exact tokens of an episode and refuses a request that "
            "changes its history (docs/agents.md, Token exactness)",
            status=409,
            code="prefix_mismatch",
        )
