"""The public reward API: what a reward function receives and returns.

A reward function scores one decoded response against the dataset example it answers. Reward
functions are plain callables or classes with ``score``/``score_batch``; they are registered by
name in :mod:`zbrl.rewards.registry`, and users plug in their own by ``module:function`` path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from zbrl.rewards.answers import GT_ANSWER, AnswerSpec


@dataclass(frozen=True)
class RewardContext:
    """What the scorer knows about a response besides its text."""

    response_tokens: int
    """Number of generated tokens (including EOS / stop string)."""
    max_new_tokens: int
    """The generation limit the response was sampled under."""
    truncated: bool = False
    """True when generation stopped at ``max_new_tokens`` without EOS or a stop string."""
    eval_mode: bool = False
    """Evaluation scoring: no length shaping; answer credit does not require valid format."""


@dataclass(frozen=True)
class RewardResult:
    """The score of one response."""

    reward: float
    """Scalar training reward."""
    format_acc: float
    """1.0 when the response has the required format, else 0.0."""
    ans_acc: float
    """Answer accuracy in [0, 1] (1.0 correct; pass fraction for code)."""
    parsed: str | None = None
    """The extracted answer or program, or None when nothing could be extracted."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Reward-specific details (per-test results for code, failure reasons, ...)."""
    timed_out: bool = False
    """The reward call missed its deadline; counted in the ``reward_timeouts`` metric."""
    failed: bool = False
    """No score: the reward could not be computed (a service or worker that did not answer, a
    deadline missed, a judge without a verdict, a sandbox that did not start). ``reward`` is
    then NaN, never a number that looks like a score; the producer counts the response and the
    buffer drops its group (``reward_failed``), so it is never trained (docs/rewards.md)."""


def failed_result(
    reason: str,
    *,
    format_acc: float = 0.0,
    ans_acc: float = 0.0,
    timed_out: bool = False,
    metadata: dict[str, Any] | None = None,
) -> RewardResult:
    """The result of a response whose reward failed: reward NaN, ``failed=True``, ``reason`` in
    ``metadata["reward_error"]``; the accuracies are a verifier's when one checked the response
    (metrics only), else 0."""
    return RewardResult(
        math.nan,
        format_acc,
        ans_acc,
        metadata={**(metadata or {}), "reward_error": reason},
        timed_out=timed_out,
        failed=True,
    )


Example = Mapping[str, Any]
"""One dataset row: ``messages`` plus ``gt_answer`` (math) or ``test_cases`` (code), and
``fields``: every other column of the row by name (see docs/datasets.md)."""


class RewardBatch(NamedTuple):
    """A batch to score: one example and one context per response, in order."""

    responses: Sequence[str]
    examples: Sequence[Example]
    contexts: Sequence[RewardContext]


@runtime_checkable
class RewardFunction(Protocol):
    """A reward: scores one response, and a batch (the default loops over ``score``)."""

    name: str

    def score(self, response: str, example: Example, ctx: RewardContext) -> RewardResult: ...

    def score_batch(
        self,
        responses: Sequence[str],
        examples: Sequence[Example],
        contexts: Sequence[RewardContext],
    ) -> list[RewardResult]: ...


class BaseReward:
    """The batch-first base of rewards: a subclass writes only its scoring.

    A reward that scores a batch at once (one round trip to a worker, a sandbox or a model)
    implements :meth:`score_responses`, which gets a non-empty :class:`RewardBatch`;
    :meth:`score` is then a batch of one. A reward that scores one response at a time implements
    :meth:`score` instead, and :meth:`score_responses` loops over it."""

    name: str = "base"
    answer: AnswerSpec = GT_ANSWER
    """The dataset field this reward scores against (checked on every line at load time)."""
    system_prompt: str | None = None
    """The default system prompt telling the model the format this reward checks (None: none)."""

    def score(self, response: str, example: Example, ctx: RewardContext) -> RewardResult:
        return self.score_batch([response], [example], [ctx])[0]

    def score_batch(
        self,
        responses: Sequence[str],
        examples: Sequence[Example],
        contexts: Sequence[RewardContext],
    ) -> list[RewardResult]:
        """One result per response, in order (none for an empty batch)."""
        check_batch_lengths(responses, examples, contexts)
        if not responses:
            return []
        return self.score_responses(RewardBatch(responses, examples, contexts))

    def score_responses(self, batch: RewardBatch) -> list[RewardResult]:
        """The scoring of a non-empty batch whose lengths are checked (the default loops over
        :meth:`score`, for rewards that implement that instead)."""
        if type(self).score is BaseReward.score:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither score_responses nor score"
            )
        return [self.score(r, e, c) for r, e, c in zip(*batch)]

    def prepare(self) -> None:
        """Start, in the background, what the first ``score_batch`` would otherwise wait for
        (nothing here). Called once by the process that will score (a producer), never by the
        pre-flight checks, which build rewards only to check them."""


def prepare_reward(reward: RewardFunction) -> None:
    """``reward.prepare()`` where it has one (a reward that implements only
    :class:`RewardFunction`'s two methods has nothing to prepare)."""
    prepare = getattr(reward, "prepare", None)
    if callable(prepare):
        prepare()


def check_batch_lengths(
    responses: Sequence[str], examples: Sequence[Example], contexts: Sequence[RewardContext]
) -> None:
    """``score_batch`` needs one example and one context per response."""
    if not (len(responses) == len(examples) == len(contexts)):
        raise ValueError(
            f"score_batch got {len(responses)} responses, {len(examples)} examples and "
            f"{len(contexts)} contexts; pass one example and one context per response"
        )


def check_score_options(owner: str, *, timeout_s: float | None, **numbers: float) -> None:
    """A scoring reward's options: each of ``numbers`` (``correct_reward``, ``wrong_reward``, ...)
    a finite number, ``correct_reward`` not below ``wrong_reward``, and ``timeout_s`` > 0 or
    None; the errors name ``owner`` and the option."""
    for option, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{owner}: {option} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{owner}: {option} must be finite, got {value}")
    correct, wrong = numbers["correct_reward"], numbers["wrong_reward"]
    if correct < wrong:
        raise ValueError(
            f"{owner}: correct_reward ({correct}) is below wrong_reward ({wrong}); a correct "
            f"answer must not score less than a wrong one"
        )
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"{owner}: timeout_s must be > 0 or None, got {timeout_s}")
