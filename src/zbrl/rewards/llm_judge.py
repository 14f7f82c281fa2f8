"""LLM-as-judge: a causal LM grades each response through a prompt template; the verdict (a
number in [0, 1]) is parsed from its reply.

The judge generates greedily through any zbrl inference backend (``generate(prompt_ids,
SamplingParams)``: transformers, vLLM). A reply with no verdict in [0, 1] is no score: the
response gets :func:`~zbrl.rewards.base.failed_result` and is counted in
:attr:`JudgeReward.parse_failures`; a batch the backend fails on or that misses the deadline gets
failed results too, counted in :attr:`JudgeReward.failures`. Failed results are never trained
(the producer counts them, the buffer drops their groups) and are logged; neither stops the
producer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from zbrl.rewards.base import Example, RewardBatch, RewardFunction, RewardResult
from zbrl.rewards.extraction import last_number
from zbrl.rewards.learned import LearnedReward

logger = logging.getLogger(__name__)

TEMPLATE_FIELDS = ("prompt", "response", "answer")


def verdict_parser(spec: str) -> Callable[[str], float | None]:
    """``last_number``: the reply's last number; otherwise a regular expression whose first group
    (or whole match) is the number. The parser returns None unless the number lies in [0, 1]."""
    if spec == "last_number":
        pattern = None
    else:
        try:
            pattern = re.compile(spec, re.DOTALL)
        except re.error as exc:
            raise ValueError(
                f"llm_judge parser {spec!r} is not a regular expression: {exc}"
            ) from None

    def parse(reply: str) -> float | None:
        if pattern is None:
            text = last_number(reply)
        else:
            matches = list(pattern.finditer(reply))
            text = (
                (matches[-1].group(1) if pattern.groups else matches[-1].group(0))
                if matches
                else None
            )
        try:
            value = float(text) if text is not None else None
        except ValueError:
            return None
        return value if value is not None and 0.0 <= value <= 1.0 else None

    return parse


def check_template(template: str) -> None:
    """A ValueError naming the unknown placeholder when ``template`` uses one."""
    try:
        template.format(**dict.fromkeys(TEMPLATE_FIELDS, ""))
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"llm_judge template: {exc!r}; it may use only {{prompt}}, {{response}} and "
            f"{{answer}} (write {{{{ and }}}} for literal braces)"
        ) from None


class JudgeReward(LearnedReward):
    """Scores responses with a generative judge (see the module docstring).

    ``backend``: an inference backend; ``tokenizer``: the judge's (its chat template renders the
    judge's user message); ``sampling``: the backend's SamplingParams for the verdict (greedy).
    """

    name = "llm_judge"

    def __init__(
        self,
        backend: Any,
        tokenizer: Any,
        sampling: Any,
        *,
        template: str,
        parser: str = "last_number",
        batch_size: int = 8,
        timeout_s: float = 60.0,
        verifier: RewardFunction | None = None,
    ) -> None:
        check_template(template)
        super().__init__(
            timeout_s=timeout_s,
            verifier=verifier,
            thread_name="llm-judge",
        )
        self.backend, self.tokenizer, self.sampling = backend, tokenizer, sampling
        self.template = template
        self.parse = verdict_parser(parser)
        self.batch_size = batch_size
        self.parse_failures = 0
        """Replies without a verdict in [0, 1]."""

    def judge_prompt(self, response: str, example: Example) -> list[int]:
        """The judge's prompt ids for one response."""
        messages = example.get("messages", [])
        question = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        answer = example.get("gt_answer")
        text = self.template.format(
            prompt=question, response=response, answer=answer if isinstance(answer, str) else ""
        )
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
            return_dict=False,
        )  # fmt: skip

    def score_responses(self, batch: RewardBatch) -> list[RewardResult]:
        prompts = [self.judge_prompt(r, e) for r, e in zip(batch.responses, batch.examples)]
        replies = self.within_deadline(lambda: self._generate(prompts), len(prompts), "verdicts")
        verdicts, metadata = [], []
        for reply in replies if replies is not None else [None] * len(prompts):
            verdict = self.parse(reply) if reply is not None else None
            verdicts.append(verdict)
            if verdict is not None:
                metadata.append({"judge_reply": reply})
                continue
            if reply is not None:
                self.parse_failures += 1
                logger.warning(
                    "llm_judge: no verdict in [0, 1] in the judge's reply %r; no score, the "
                    "group is not trained (%d unparsed so far)", reply[:120],
                    self.parse_failures,
                )  # fmt: skip
            reason = "no verdict" if reply is not None else "judge failed"
            metadata.append({"reward_error": reason, "judge_reply": reply})
        return self.results(verdicts, batch, metadata)

    def _generate(self, prompts: list[list[int]]) -> list[str]:
        """The judge's reply per prompt, ``batch_size`` prompts per ``generate``."""
        replies: list[str] = []
        for start in range(0, len(prompts), self.batch_size):
            outputs = self.backend.generate(prompts[start : start + self.batch_size], self.sampling)
            replies += [completions[0].text for completions in outputs]
        return replies
