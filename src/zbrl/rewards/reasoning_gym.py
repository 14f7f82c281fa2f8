"""The ``reasoning_gym`` reward: a reasoning-gym problem scored by its task's own
``score_answer(answer, entry)``.

The answer is taken from the response by the ``extract`` setting (:mod:`zbrl.rewards.extraction`:
``full``, ``last_number``, ``answer_tags``, ``boxed``); the entry is rebuilt from the example
(:func:`entry_of`). The scorer is the task built with the same
config as the data source (``tasks``, :mod:`zbrl.rewards.reasoning_gym_tasks`), or, without
``tasks``, the task's default scorer.

Score: ``wrong_reward + (correct_reward - wrong_reward) * s`` for the task's score ``s`` in [0, 1]
(some tasks give partial credit), plus the length penalty in training; ``ans_acc`` is ``s`` and
``format_acc`` is 1.0 when an answer was extracted. A response without an answer in the chosen
format scores ``wrong_reward``. With ``timeout_s`` every scorer call runs in a killable worker
process (:mod:`zbrl.rewards.deadline`), one round trip per batch; a call past its deadline or one
that raises scores as wrong (``timed_out`` / ``metadata["reason"]`` say why).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from zbrl.rewards.answers import GT_ANSWER
from zbrl.rewards.base import (
    BaseReward,
    RewardBatch,
    RewardContext,
    RewardResult,
    check_score_options,
)
from zbrl.rewards.deadline import DEFAULT_TIMEOUT_S, DeadlineExceeded, DeadlinePool, Failed
from zbrl.rewards.extraction import EXTRACTION_PROMPTS, EXTRACTIONS, extract_answer
from zbrl.rewards.length import LengthShaping, as_length_shaping, training_penalty
from zbrl.rewards.reasoning_gym_tasks import TaskSpec, create_dataset
from zbrl.rewards.registry import register_reward

logger = logging.getLogger(__name__)

_SCORERS: dict[str | None, Any] = {}


def entry_of(example: Mapping[str, Any]) -> dict[str, Any]:
    """The reasoning-gym entry an example was made from (question, answer, metadata)."""
    fields = example.get("fields")
    metadata = fields.get("metadata") if isinstance(fields, Mapping) else None
    if not isinstance(metadata, Mapping) or "source_dataset" not in metadata:
        raise ValueError(
            "the example carries no reasoning-gym metadata (fields.metadata.source_dataset); "
            "the reasoning_gym reward scores examples of a data.source of type reasoning_gym"
        )
    users = [m["content"] for m in example.get("messages", ()) if m.get("role") == "user"]
    return {
        "question": users[-1] if users else "",
        "answer": example.get("gt_answer"),
        "metadata": dict(metadata),
    }


def score_entry(answer: str, entry: dict[str, Any], tasks_json: str | None) -> float:
    """The task's ``score_answer(answer, entry)`` (the scorer built once per process)."""
    scorer = _SCORERS.get(tasks_json)
    if scorer is None:
        if tasks_json is None:
            import reasoning_gym

            return float(
                reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])(
                    answer, entry
                )
            )
        tasks = [TaskSpec(**t) for t in json.loads(tasks_json)]
        scorer = _SCORERS[tasks_json] = create_dataset(tasks, size=1, seed=0).score_answer
    return float(scorer(answer, entry))


@register_reward("reasoning_gym")
class ReasoningGymReward(BaseReward):
    """Scores reasoning-gym problems with the task's own scorer (see the module docstring)."""

    name = "reasoning_gym"
    answer = GT_ANSWER
    system_prompt = EXTRACTION_PROMPTS["answer_tags"]
    """The default system prompt of the default extraction (``answer_tags``)."""

    def __init__(
        self,
        *,
        extract: str = "answer_tags",
        tasks: Sequence[Mapping[str, Any]] | None = None,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
        length_shaping: LengthShaping | Mapping[str, Any] | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        if extract not in EXTRACTIONS:
            raise ValueError(
                f"reasoning_gym: extract must be one of {', '.join(EXTRACTIONS)}, got {extract!r}"
            )
        check_score_options(
            "reasoning_gym",
            timeout_s=timeout_s,
            correct_reward=correct_reward,
            wrong_reward=wrong_reward,
        )
        self.extract = extract
        self.tasks_json = (
            json.dumps([dict(t) for t in tasks], sort_keys=True) if tasks is not None else None
        )
        self.correct_reward = float(correct_reward)
        self.wrong_reward = float(wrong_reward)
        self.length_shaping = as_length_shaping(length_shaping, self.name)
        self.timeout_s = timeout_s
        self.timeouts = 0
        self._pool: DeadlinePool | None = None

    def score_responses(self, batch: RewardBatch) -> list[RewardResult]:
        responses, examples, contexts = batch
        entries = [entry_of(example) for example in examples]
        answers = [extract_answer(response, self.extract) for response in responses]
        calls = [(a, e, self.tasks_json) for a, e in zip(answers, entries) if a is not None]
        outcomes = iter(self._score_many(calls))
        return [
            self._result(answer, next(outcomes) if answer is not None else None, ctx)
            for answer, ctx in zip(answers, contexts)
        ]

    def _score_many(self, calls: list[tuple[str, dict[str, Any], str | None]]) -> list[Any]:
        if not calls:
            return []
        if self.timeout_s is None:
            outcomes: list[Any] = []
            for call in calls:
                try:
                    outcomes.append(score_entry(*call))
                except Exception as exc:  # a scorer that fails on an odd answer: a wrong answer
                    outcomes.append(Failed(exc))
            return outcomes
        if self._pool is None:
            self._pool = DeadlinePool(max_workers=1, preload=("reasoning_gym",))
        return self._pool.run_many(score_entry, calls, self.timeout_s)

    def _result(self, answer: str | None, outcome: Any, ctx: RewardContext) -> RewardResult:
        timed_out = False
        if answer is None:
            score, reason = 0.0, f"no answer ({self.extract})"
        elif isinstance(outcome, Failed):
            timed_out = isinstance(outcome.error, DeadlineExceeded)
            if timed_out:
                self.timeouts += 1
                logger.warning(
                    "reasoning_gym: score_answer did not return within %.1f s (reward.timeout_s);"
                    " scored as wrong (%d time(s) so far)",
                    self.timeout_s,
                    self.timeouts,
                )
            score, reason = 0.0, f"scorer failed: {outcome.error!r:.200}"
        else:
            score = float(outcome) if math.isfinite(float(outcome)) else 0.0
            score = min(max(score, 0.0), 1.0)
            reason = "correct" if score >= 1.0 else "partial" if score > 0 else "wrong_answer"
        penalty = training_penalty(self.length_shaping, ctx)
        reward = self.wrong_reward + (self.correct_reward - self.wrong_reward) * score + penalty
        return RewardResult(
            reward=reward,
            format_acc=1.0 if answer is not None else 0.0,
            ans_acc=score,
            parsed=answer,
            metadata={"score": score, "length_penalty": penalty, "reason": reason},
            timed_out=timed_out,
        )
