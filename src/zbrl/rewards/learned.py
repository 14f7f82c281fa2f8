"""The shared part of learned rewards (a reward model, an LLM judge): their scores come from a
model, a batch at a time in a thread of the reward's own under the deadline ``timeout_s``. A
batch that fails or misses the deadline gets no score: its responses get
:func:`~zbrl.rewards.base.failed_result` (reward NaN; their groups are never trained), the batch
is counted in :attr:`LearnedReward.failures` and logged, and the producer goes on; a verifiable
reward (``verifier``), when given, sets the accuracy metrics while the reward is the model's
score.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from zbrl.rewards.base import (
    BaseReward,
    RewardBatch,
    RewardFunction,
    RewardResult,
    failed_result,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LearnedReward(BaseReward):
    """A reward whose scores come from a model under a deadline (see the module docstring).
    Subclasses score in :meth:`score_responses`, call the model through :meth:`within_deadline`
    and build their results with :meth:`results`."""

    def __init__(
        self,
        *,
        timeout_s: float,
        verifier: RewardFunction | None,
        thread_name: str,
    ) -> None:
        self.timeout_s = timeout_s
        self.verifier = verifier
        self.failures = 0
        """Batches whose model call failed or did not finish within the deadline."""
        self.last_error = ""
        """Why the last failed batch failed."""
        self._thread_name = thread_name
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=thread_name)
        self._lock = threading.Lock()

    def within_deadline(self, call: Callable[[], T], n: int, what: str) -> T | None:
        """``call()`` in the reward's thread within ``timeout_s``; None when it raised or was
        late (``n`` responses without a score, counted and logged; ``what`` names what did not
        come back in time)."""
        future = self._pool.submit(call)
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            reason = f"no {what} within {self.timeout_s} s (reward.timeout_s)"
            # the late call still holds its thread: later batches get a fresh one
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=self._thread_name)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.failures += 1
            self.last_error = reason
        logger.warning(
            "%s: no score for %d response(s): %s (%d failed batch(es) so far); their groups "
            "are not trained", self.name, n, reason, self.failures,
        )  # fmt: skip
        return None

    def results(
        self,
        scores: Sequence[float | None],
        batch: RewardBatch,
        metadata: Sequence[dict[str, Any]],
    ) -> list[RewardResult]:
        """The results of ``scores`` (None where the model gave none), with the verifier's
        accuracies when there is a verifier (:func:`learned_results`)."""
        checked = self.verifier.score_batch(*batch) if self.verifier is not None else None
        return learned_results(scores, checked, metadata)


def learned_results(
    scores: Sequence[float | None],
    checked: Sequence[RewardResult] | None,
    metadata: Sequence[dict[str, Any]],
) -> list[RewardResult]:
    """The results of a learned reward (a reward model's or a judge's score per response; None
    where it gave none). The score is the reward. A verifier's results (``checked``) set the
    format and answer accuracy and ``parsed``; without one the format counts as met and the
    accuracy is the score clipped to [0, 1]. A response without a score gets
    :func:`~zbrl.rewards.base.failed_result` (its ``metadata["reward_error"]`` says why),
    keeping the verifier's accuracies as metrics (0 without a verifier)."""
    results = []
    for i, value in enumerate(scores):
        c = checked[i] if checked is not None else None
        if value is None:
            fmt, acc = (c.format_acc, c.ans_acc) if c is not None else (0.0, 0.0)
            details = dict(metadata[i])
            reason = str(details.pop("reward_error", "no score"))
            results.append(failed_result(reason, format_acc=fmt, ans_acc=acc, metadata=details))
        elif c is not None:
            results.append(
                RewardResult(value, c.format_acc, c.ans_acc, parsed=c.parsed, metadata=metadata[i])
            )
        else:
            results.append(
                RewardResult(value, 1.0, min(max(value, 0.0), 1.0), metadata=metadata[i])
            )
    return results
