"""Prompt templates and prompt encoding.

Each reward class carries its own default system prompt (``system_prompt``), telling the model
the answer format that reward checks. :class:`PromptEncoder` turns a dataset example into prompt
token ids with the tokenizer's chat template (plus the generation prompt) and applies the over-long
policy: drop the prompt, or keep its **last** ``max_prompt_tokens`` ids so that the generation
prompt survives. Prompts are never right-truncated.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from zbrl.data.dataset import DatasetError, PromptExample

logger = logging.getLogger(__name__)

Overlong = Literal["drop", "left_truncate"]
OVERLONG_POLICIES: tuple[str, ...] = ("drop", "left_truncate")


def resolve_system_prompt(system_prompt: str | None, default: str | None) -> str | None:
    """The system prompt to use: the configured one, else the reward's ``default``.

    ``default`` is the reward's own ``system_prompt`` (the format it checks; None for a user reward
    given by import path). An empty configured string means "no system prompt".
    """
    if system_prompt is not None:
        return system_prompt if system_prompt.strip() else None
    return default


def _messages_of(example: PromptExample | Mapping[str, Any]) -> Sequence[Mapping[str, str]]:
    if isinstance(example, PromptExample):
        return example.messages
    if isinstance(example, Mapping) and "messages" in example:
        return example["messages"]
    raise TypeError(
        f"expected a PromptExample or a mapping with 'messages', got {type(example).__name__}"
    )


def build_messages(
    example: PromptExample | Mapping[str, Any],
    system_prompt: str | None,
    tool_section: str | None = None,
) -> list[dict[str, str]]:
    """The conversation to template: the example's messages, with ``system_prompt`` first.

    The system prompt is not added when it is None or blank, or when the example already has a
    system message (the example's own system message wins). ``tool_section`` (the tools the
    model may call, for a template that does not render tools) ends the first system message,
    or is one when there is none. Returns fresh dicts.
    """
    messages = [dict(m) for m in _messages_of(example)]
    has_system = any(m["role"] == "system" for m in messages)
    if system_prompt is not None and system_prompt.strip() and not has_system:
        messages.insert(0, {"role": "system", "content": system_prompt})
    if tool_section:
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{tool_section}"
        else:
            messages.insert(0, {"role": "system", "content": tool_section})
    return messages


def as_token_ids(output: Any) -> list[int]:
    """Normalise what ``apply_chat_template(..., tokenize=True)`` returns to ``list[int]``.

    transformers 4.x returns a list of ids; 5.x a ``BatchEncoding`` with ``input_ids``; with
    ``return_tensors`` it is a tensor/array, possibly with a batch dimension of one.
    """
    if isinstance(output, Mapping) or (hasattr(output, "keys") and hasattr(output, "__getitem__")):
        if "input_ids" not in output:
            raise TypeError(
                "apply_chat_template returned a mapping without 'input_ids'; "
                "call it with tokenize=True"
            )
        output = output["input_ids"]
    if hasattr(output, "tolist"):
        output = output.tolist()
    if isinstance(output, str):
        raise TypeError("apply_chat_template returned text; call it with tokenize=True")
    output = list(output)
    if len(output) == 1 and isinstance(output[0], (list, tuple)):
        output = list(output[0])
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in output):
        raise TypeError("apply_chat_template did not return a flat sequence of token ids")
    return output


class PromptEncoder:
    """Encodes examples to prompt ids under a token budget.

    ``overlong="drop"`` skips prompts longer than ``max_prompt_tokens`` (``encode`` returns None,
    ``self.dropped`` counts them); ``"left_truncate"`` keeps their last ``max_prompt_tokens`` ids
    so the generation prompt survives (``self.truncated`` counts them). Counters accumulate over
    the encoder's life.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_prompt_tokens: int,
        overlong: Overlong = "drop",
        system_prompt: str | None,
        tools: list[dict[str, Any]] | None = None,
        tool_section: str | None = None,
    ) -> None:
        if isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int):
            raise TypeError(f"max_prompt_tokens must be an int, got {max_prompt_tokens!r}")
        if max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
        if overlong not in OVERLONG_POLICIES:
            raise ValueError(
                f"overlong must be one of {', '.join(OVERLONG_POLICIES)}, got {overlong!r}"
            )
        if getattr(tokenizer, "chat_template", "") is None:
            raise ValueError(
                "the tokenizer has no chat_template; set tokenizer.chat_template to a Jinja "
                "template or use a tokenizer that ships one"
            )
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.overlong: Overlong = overlong
        self.system_prompt = system_prompt
        self.tools = tools
        """Tool schemas passed to the chat template as ``tools=`` (a template that renders
        them); None passes none."""
        self.tool_section = tool_section
        """The tools described in the system prompt (a template that does not render them)."""
        self.dropped = 0
        """Prompts dropped for being longer than ``max_prompt_tokens``."""
        self.truncated = 0
        """Prompts left-truncated to ``max_prompt_tokens``."""

    def token_ids(self, example: PromptExample | Mapping[str, Any]) -> list[int]:
        """The full templated prompt ids (with the generation prompt), before the budget."""
        messages = build_messages(example, self.system_prompt, self.tool_section)
        extra = {} if self.tools is None else {"tools": self.tools}
        output = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **extra
        )
        return as_token_ids(output)

    def encode(self, example: PromptExample | Mapping[str, Any]) -> list[int] | None:
        """Prompt ids within the budget, or None when the prompt is over-long and dropped."""
        return self._apply_budget(self.token_ids(example))

    def _apply_budget(self, ids: list[int]) -> list[int] | None:
        if len(ids) <= self.max_prompt_tokens:
            return ids
        if self.overlong == "drop":
            self.dropped += 1
            return None
        self.truncated += 1
        return ids[-self.max_prompt_tokens :]

    def encode_all(
        self, examples: Iterable[PromptExample | Mapping[str, Any]]
    ) -> tuple[list[tuple[Any, list[int]]], dict[str, float]]:
        """Encode many examples: ``([(example, ids), ...], stats)``; dropped ones are left out.

        ``stats`` (for this call): ``examples``, ``kept``, ``dropped``, ``truncated``,
        ``max_prompt_tokens``, ``longest_prompt_tokens`` (before the budget) and
        ``mean_prompt_tokens`` (of the kept prompts). Raises :class:`DatasetError` when every
        prompt was dropped.
        """
        kept: list[tuple[Any, list[int]]] = []
        dropped_before, truncated_before = self.dropped, self.truncated
        total = 0
        longest = 0
        for example in examples:
            total += 1
            full = self.token_ids(example)
            longest = max(longest, len(full))
            ids = self._apply_budget(full)
            if ids is not None:
                kept.append((example, ids))
        stats: dict[str, float] = {
            "examples": total,
            "kept": len(kept),
            "dropped": self.dropped - dropped_before,
            "truncated": self.truncated - truncated_before,
            "max_prompt_tokens": self.max_prompt_tokens,
            "longest_prompt_tokens": longest,
            "mean_prompt_tokens": (sum(len(ids) for _, ids in kept) / len(kept)) if kept else 0.0,
        }
        if total and not kept:
            raise DatasetError(
                f"all {total} prompts are longer than max_prompt_tokens={self.max_prompt_tokens} "
                f"(longest: {longest} tokens with the chat template). Fix: raise "
                f"max_prompt_tokens to at least {longest}, or set overlong='left_truncate'"
            )
        if stats["dropped"] or stats["truncated"]:
            action = "dropped" if self.overlong == "drop" else "left-truncated"
            logger.warning(
                "%d of %d prompts are longer than max_prompt_tokens=%d and were %s "
                "(longest: %d tokens)",
                stats["dropped"] + stats["truncated"],
                total,
                self.max_prompt_tokens,
                action,
                longest,
            )
        return kept, stats
