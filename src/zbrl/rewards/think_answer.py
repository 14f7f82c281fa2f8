"""The ``think_answer_tags`` reward: ``<think> reasoning </think><answer> final answer </answer>``.

The answer is the text between the last ``</answer>`` and the ``<answer>`` before it, stripped
(for a well-formed response: the content of its one ``<answer>…</answer>``, newlines included).
The format is valid iff each of the four tags occurs exactly once, in the order think-open <
think-close < answer-open < answer-close, and the stripped response ends with ``</answer>``.
Scoring (format gating, eval mode, length shaping) is that of
:class:`~zbrl.rewards.math_reward.MathAnswerReward`.
"""

from __future__ import annotations

from zbrl.rewards.math_reward import MathAnswerReward
from zbrl.rewards.registry import register_reward

DEFAULT_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@register_reward("think_answer_tags")
class ThinkAnswerReward(MathAnswerReward):
    """Reward for ``<think>…</think><answer>…</answer>`` responses checked against ``gt_answer``.

    ``tags`` are the (think-open, think-close, answer-open, answer-close) strings.
    """

    name = "think_answer_tags"
    system_prompt = (
        "You are a careful problem solver. First reason about the problem step by step inside "
        "<think> </think> tags. Then write only the final answer inside <answer> </answer> tags. "
        "Use each tag exactly once and write nothing after </answer>. "
        "Format: <think> your reasoning </think><answer> final answer </answer>"
    )
    """The default system prompt: the format this reward checks."""

    format_tags = DEFAULT_TAGS
    """(think-open, think-close, answer-open, answer-close)."""

    def check_tags(self, tags: tuple[str, ...]) -> tuple[str, ...]:
        if len(tags) != 4 or not all(isinstance(t, str) and t for t in tags):
            raise ValueError(
                f"think_answer_tags: tags must be 4 non-empty strings (think-open, think-close, "
                f"answer-open, answer-close), got {tags!r}"
            )
        if len(set(tags)) != 4:
            raise ValueError(f"think_answer_tags: the 4 tags must be different, got {tags!r}")
        return tags

    def extract(self, response: str) -> tuple[str | None, bool, str | None]:
        _, _, open_tag, close_tag = self.tags
        close = response.rfind(close_tag)
        answer = None
        if close >= 0:
            start = response.rfind(open_tag, 0, close)
            if start >= 0:
                answer = response[start + len(open_tag) : close].strip()
        problem = self.format_problem(response)
        return answer, problem is None, problem

    def format_problem(self, response: str) -> str | None:
        """Why the format is invalid, or None when it is valid."""
        for tag in self.tags:
            count = response.count(tag)
            if count != 1:
                return f"{tag} occurs {count} times (expected once)"
        positions = [response.find(tag) for tag in self.tags]
        if positions != sorted(positions):
            return "tags out of order (expected " + " < ".join(self.tags) + ")"
        if not response.strip().endswith(self.tags[3]):
            return f"text after {self.tags[3]}"
        return None
