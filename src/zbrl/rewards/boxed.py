"""The ``boxed`` reward: the final answer is the last ``\\boxed{…}`` (or ``\\fbox{…}``).

Braces are matched with nesting (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; escaped
``\\{``/``\\}`` do not count). "Last" means the last top-level box: a box inside another box is
part of the outer one, and when the last box never closes (a truncated response) there is no
answer. The format is valid iff a boxed answer exists and each of the optional ``tags`` occurs
exactly once. Scoring is :class:`~zbrl.rewards.math_reward.MathAnswerReward`'s.
"""

from __future__ import annotations

import re

from zbrl.rewards.answer_check import match_brace
from zbrl.rewards.math_reward import MathAnswerReward
from zbrl.rewards.registry import register_reward

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last top-level ``\\boxed{…}``/``\\fbox{…}``, or None."""
    found: str | None = None
    pos = 0
    while True:
        m = _BOX.search(text, pos)
        if m is None:
            return found
        open_index = m.end() - 1
        close = match_brace(text, open_index)
        if close is None:
            return None  # the last box never closes
        found = text[open_index + 1 : close]
        pos = close + 1


@register_reward("boxed")
class BoxedReward(MathAnswerReward):
    """Reward for a final answer in ``\\boxed{}``, checked against ``gt_answer``."""

    name = "boxed"
    system_prompt = (
        "You are a careful problem solver. Reason about the problem step by step, then give the "
        "final answer in LaTeX inside \\boxed{}, for example \\boxed{42}. "
        "Put only the final answer in the box, and box exactly one answer."
    )
    """The default system prompt: the format this reward checks."""

    format_tags = ()
    """No tags by default; each of ``tags`` must occur exactly once."""

    def check_tags(self, tags: tuple[str, ...]) -> tuple[str, ...]:
        if not all(isinstance(t, str) and t for t in tags):
            raise ValueError(f"boxed: tags must be non-empty strings, got {tags!r}")
        return tags

    def extract(self, response: str) -> tuple[str | None, bool, str | None]:
        answer = last_boxed(response)
        answer = answer.strip() if answer is not None else None
        if answer is None:
            return None, False, "no complete \\boxed{} answer"
        if not answer:
            return None, False, "empty \\boxed{}"
        for tag in self.tags:
            count = response.count(tag)
            if count != 1:
                return answer, False, f"{tag} occurs {count} times (expected once)"
        return answer, True, None
