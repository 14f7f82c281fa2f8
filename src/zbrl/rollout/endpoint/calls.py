"""Generation calls waiting for the backend, and how they are batched.

HTTP handler threads :meth:`CallQueue.submit` a context (token ids) with its sampling parameters
and wait on the returned future; the thread that owns the backend (the producer's, or the serve
loop's) :meth:`CallQueue.take`\\ s a batch and resolves the futures. A batch closes when every
episode that may still call has called, or ``window_s`` after its first call, whichever is first,
so concurrent episodes share one backend call without waiting for a slow one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from zbrl.rollout.backends.base import Completion, SamplingParams


@dataclass(frozen=True)
class Generated:
    """A call's answer: the completion and the policy version that generated it."""

    completion: Completion
    version: int


@dataclass
class PendingCall:
    """A context waiting to be continued by one sample."""

    ids: list[int]
    params: SamplingParams
    future: Future[Generated] = field(default_factory=Future)


class CallQueue:
    """Calls from many episodes, handed out in batches (see the module docstring)."""

    def __init__(self, window_s: float, max_batch: int) -> None:
        self.window_s = window_s
        self.max_batch = max_batch
        self._pending: list[PendingCall] = []
        self._cond = threading.Condition()

    def submit(self, ids: list[int], params: SamplingParams) -> Future[Generated]:
        call = PendingCall(ids, params)
        with self._cond:
            self._pending.append(call)
            self._cond.notify_all()
        return call.future

    def take(self, callers: Callable[[], int], timeout_s: float) -> list[PendingCall]:
        """The next batch: waits up to ``timeout_s`` for a first call (empty list: none came),
        then until ``callers()`` calls are pending (every episode that may still call has) or
        ``window_s`` has passed; at most ``max_batch`` calls."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending, timeout=timeout_s):
                return []
            deadline = time.monotonic() + self.window_s
            while len(self._pending) < min(callers(), self.max_batch):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            return batch

    def cancel_pending(self, reason: str) -> None:
        """Fail every call still waiting (its episode ended without waiting for it)."""
        with self._cond:
            pending, self._pending = self._pending, []
        for call in pending:
            call.future.set_exception(RuntimeError(reason))

    def wake(self) -> None:
        """Let a waiting :meth:`take` re-check ``callers()`` (an episode finished)."""
        with self._cond:
            self._cond.notify_all()


def answer(
    batch: list[PendingCall],
    generate: Callable[[list[list[int]], SamplingParams], list[list[Completion]]],
    version: int,
) -> None:
    """Generate every call of ``batch`` (one ``generate`` per distinct sampling parameters) and
    resolve its future; a failing ``generate`` fails those calls' futures, not the caller."""
    by_params: dict[SamplingParams, list[PendingCall]] = {}
    for call in batch:
        by_params.setdefault(call.params, []).append(call)
    for params, calls in by_params.items():
        try:
            out = generate([c.ids for c in calls], params)
        except Exception as e:
            for c in calls:
                c.future.set_exception(e)
            continue
        for c, comps in zip(calls, out, strict=True):
            c.future.set_result(Generated(comps[0], version))


def serve_calls(
    queue: CallQueue,
    generate: Callable[[list[list[int]], SamplingParams], list[list[Completion]]],
    version: int,
    stop: threading.Event,
) -> None:
    """Answer calls in batches until ``stop`` is set (``zbrl serve``, where no episode runner
    drives the queue)."""
    while not stop.is_set():
        batch = queue.take(lambda: queue.max_batch, timeout_s=0.1)
        if batch:
            answer(batch, generate, version)
