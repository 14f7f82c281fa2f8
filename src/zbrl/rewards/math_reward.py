"""The shared scoring rule of the math rewards (``think_answer_tags``, ``boxed``): they differ
only in how they extract the answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zbrl.rewards.answer_check import DEFAULT_TIMEOUT_S, answers_equivalent_many, check_gold
from zbrl.rewards.base import (
    BaseReward,
    Example,
    RewardBatch,
    RewardContext,
    RewardResult,
    check_score_options,
)
from zbrl.rewards.deadline import default_pool
from zbrl.rewards.length import LengthShaping, as_length_shaping, training_penalty

# --------------------------------------------------------------------------------------------
# The shared scoring rule of the math rewards


class MathAnswerReward(BaseReward):
    """Score = answer credit + format bonus + length penalty.

    * answer credit: ``correct_reward`` when the extracted answer is equivalent to the gold one
      and (the format is valid, or ``ctx.eval_mode``), else ``wrong_reward``; in training a
      badly formatted response is not checked at all;
    * ``format_reward`` is added when the format is valid (default 0: format only gates);
    * ``length_shaping.penalty(...)`` is added to every response in training (not in eval),
      whether or not an answer was extracted.

    ``format_acc`` is 1.0 for valid format; ``ans_acc`` is 1.0 exactly when the answer got
    credit (correct, and format valid or eval mode). ``metadata`` holds ``format_valid``,
    ``answer_correct`` (None when not checked), ``match_method``, ``length_penalty`` and
    ``reason`` (``"correct"``, ``"wrong_answer"``, ``"no_answer"`` or ``"bad_format: ..."``).
    Subclasses implement :meth:`extract`.
    """

    name = "math"
    format_tags: tuple[str, ...] | None = None
    """The tags the format check requires unless the ``tags`` option replaces them (None: the
    reward checks no tags and takes no ``tags`` option)."""

    def __init__(
        self,
        *,
        tags: Sequence[str] | None = None,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
        format_reward: float = 0.0,
        length_shaping: LengthShaping | Mapping[str, Any] | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        answer_field: str = "gt_answer",
    ) -> None:
        check_score_options(
            self.name,
            timeout_s=timeout_s,
            correct_reward=correct_reward,
            wrong_reward=wrong_reward,
            format_reward=format_reward,
        )
        self.correct_reward = float(correct_reward)
        self.wrong_reward = float(wrong_reward)
        self.format_reward = float(format_reward)
        self.length_shaping = as_length_shaping(length_shaping, self.name)
        self.timeout_s = timeout_s
        self.answer_field = answer_field
        if tags is not None and self.format_tags is None:
            raise TypeError(f"reward {self.name!r} cannot take options ['tags']: it checks no tags")
        chosen = self.format_tags if tags is None else tags
        self.tags = self.check_tags((chosen,) if isinstance(chosen, str) else tuple(chosen or ()))

    def prepare(self) -> None:
        """Start the answer checker's deadline worker now (:meth:`DeadlinePool.prestart`), so
        that the first batch does not wait for its start-up."""
        if self.timeout_s is not None:
            default_pool().prestart()

    def check_tags(self, tags: tuple[str, ...]) -> tuple[str, ...]:
        """The ``tags`` this reward checks (a ValueError naming the problem when they do not fit
        its format); by default any."""
        return tags

    def extract(self, response: str) -> tuple[str | None, bool, str | None]:
        """``(answer or None, format_valid, why the format is invalid or None)``."""
        raise NotImplementedError

    def gold(self, example: Example) -> str:
        if self.answer_field not in example:
            raise ValueError(
                f"{self.name} reward: the example has no {self.answer_field!r} field (fields: "
                f"{', '.join(sorted(map(str, example))) or 'none'}); add the gold answer to the "
                f"dataset row"
            )
        return check_gold(example[self.answer_field], field=self.answer_field)

    def score_responses(self, batch: RewardBatch) -> list[RewardResult]:
        """Every answer check of the batch in one round trip to the deadline worker."""
        responses, examples, contexts = batch
        golds = [self.gold(example) for example in examples]
        extracted = [self.extract(response) for response in responses]
        checked = [
            answer is not None and (format_valid or ctx.eval_mode)
            for (answer, format_valid, _), ctx in zip(extracted, contexts, strict=True)
        ]
        pairs = [(e[0], gold) for e, gold, c in zip(extracted, golds, checked) if c]
        verdicts = iter(answers_equivalent_many(pairs, timeout_s=self.timeout_s))
        return [
            self._result(*e, *(next(verdicts) if c else (False, "none")), checked=c, ctx=ctx)
            for e, c, ctx in zip(extracted, checked, contexts, strict=True)
        ]

    def _result(
        self,
        answer: str | None,
        format_valid: bool,
        format_problem: str | None,
        correct: bool,
        method: str,
        *,
        checked: bool,
        ctx: RewardContext,
    ) -> RewardResult:
        reward = self.correct_reward if correct else self.wrong_reward
        if format_valid:
            reward += self.format_reward
        penalty = training_penalty(self.length_shaping, ctx)
        reward += penalty
        if correct:
            reason = "correct"
        elif answer is None:
            reason = "no_answer"
        elif not format_valid:
            reason = f"bad_format: {format_problem}"
        else:
            reason = "wrong_answer"
        return RewardResult(
            reward=reward,
            format_acc=1.0 if format_valid else 0.0,
            ans_acc=1.0 if correct else 0.0,
            parsed=answer,
            metadata={
                "format_valid": format_valid,
                "answer_correct": correct if checked else None,
                "match_method": method,
                "length_penalty": penalty,
                "reason": reason,
            },
        )
