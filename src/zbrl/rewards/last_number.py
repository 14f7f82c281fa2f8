"""The ``last_number`` reward: the final answer is the last number of the response.

For prompts such as "Answer with only the final number." or responses that end with the result.
The number is found by :func:`zbrl.rewards.extraction.last_number` (the same extractor as the
``reasoning_gym`` reward's ``extract: last_number``) and compared with ``gt_answer`` by the math
rewards' rule (math_verify under a deadline, then a normalised string match). The format is valid
iff the response contains a number. Scoring is that of
:class:`~zbrl.rewards.math_reward.MathAnswerReward`.
"""

from __future__ import annotations

from zbrl.rewards.extraction import EXTRACTION_PROMPTS, last_number
from zbrl.rewards.math_reward import MathAnswerReward
from zbrl.rewards.registry import register_reward


@register_reward("last_number")
class LastNumberReward(MathAnswerReward):
    """Reward for a response whose last number equals ``gt_answer``."""

    name = "last_number"
    system_prompt = EXTRACTION_PROMPTS["last_number"]
    """The default system prompt: end with the answer as a number."""

    def extract(self, response: str) -> tuple[str | None, bool, str | None]:
        answer = last_number(response)
        if answer is None:
            return None, False, "no number in the response"
        return answer, True, None
