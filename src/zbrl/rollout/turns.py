"""Environment messages as tokens to append, through the model's own chat template, without ever
rendering the conversation again.

The template is asked twice, once per message: a fixed two-message conversation (user, assistant)
and the same conversation with the environment's message and the generation prompt. The text the
second adds to the first is the message as the template writes it (role header, content, end of
turn, next assistant header). What closes an assistant turn in the template (``<|im_end|>\\n``,
``<|end|>``) is found once the same way; the part of it the model did not generate itself (the
``\\n`` after an EOS it sampled, or all of it when a stop string ended the turn) goes first. That
text is tokenized once and appended to the ids the policy generated; nothing before it is
re-tokenized, so the trained sequence is what the policy saw, turn by turn.
"""

from __future__ import annotations

from typing import Any

from zbrl.errors import RunError

_SENTINEL = "ZBRL_ASSISTANT_SENTINEL"
_BASE = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": _SENTINEL}]


class TurnFormatter:
    """Chat-template text and token ids of environment messages for one tokenizer."""

    def __init__(
        self,
        tokenizer: Any,
        role: str,
        *,
        eos_ids: set[int],
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.role = role
        self.eos_ids = eos_ids
        self.tools = tools
        """The tool schemas the prompts were rendered with (``tools=``), so that each message
        is the text the template writes in that same conversation; None: none."""
        self._base = self._render(_BASE, generation_prompt=False)
        at = self._base.find(_SENTINEL)
        if at < 0:
            raise RunError(
                "environment: the chat template does not write an assistant message's content "
                "as given; multi-turn episodes need a template that does"
            )
        self.turn_close = self._base[at + len(_SENTINEL) :]
        """What the template writes after an assistant message's content."""
        self.message_text("probe")  # a template that refuses the role fails now, not mid-run

    def _render(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
        try:
            extra = {} if self.tools is None else {"tools": self.tools}
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt, **extra
            )
        except Exception as e:
            raise RunError(
                f"environment.message_role: the chat template cannot render a {self.role!r} "
                f"message after an assistant turn ({type(e).__name__}: {e}); set "
                "environment.message_role to a role it knows (e.g. user)"
            ) from None

    def message_text(self, content: str) -> str:
        """The template's text for an environment message and the next assistant header."""
        full = self._render(
            [*_BASE, {"role": self.role, "content": content}], generation_prompt=True
        )
        if not full.startswith(self._base):
            raise RunError(
                "environment: the chat template changes earlier turns when a message is added "
                "(its rendering is not prefix-preserving), so environment messages cannot be "
                "appended as tokens; set model.chat_template to a template without that"
            )
        return full[len(self._base) :]

    def bridge(self, model_ids: list[int]) -> str:
        """The end of the assistant turn the model did not generate: after an EOS token, what the
        template writes after that token; after a stop string, the whole turn close."""
        if model_ids and model_ids[-1] in self.eos_ids:
            eos_text = self.tokenizer.decode([model_ids[-1]], skip_special_tokens=False)
            at = self.turn_close.find(eos_text) if eos_text else -1
            if at >= 0:
                return self.turn_close[at + len(eos_text) :]
        return self.turn_close

    def environment_ids(self, model_ids: list[int], content: str) -> tuple[list[int], str]:
        """Token ids (and their text) to append after the model turn ``model_ids``."""
        text = self.bridge(model_ids) + self.message_text(content)
        return list(self.tokenizer.encode(text, add_special_tokens=False)), text
