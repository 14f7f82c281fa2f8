"""A remote reward: batches of (prompt, response) POSTed as JSON to a scoring service.

Request body: ``{"items": [{"prompt": [messages...], "response": str, "gt_answer": str | None,
"fields": {...}}, ...]}`` — every item carries its dataset row's ``gt_answer`` and ``fields``
(also when a ``verifier`` sets the accuracy metrics); the service answers ``{"rewards": [number,
...]}``, one per item, in order (optionally ``"ans_acc": [...]`` and ``"format_acc": [...]`` in
[0, 1]).

A batch is split into requests of ``batch_size`` items, at most ``max_concurrency`` in flight
(a thread pool of the standard library's ``http.client``). A request that fails with a connection
error, a timeout, HTTP 429 or 5xx is retried until the batch's deadline ``timeout_s``, waiting
``backoff_s``, then twice that, and so on up to ``max_backoff_s`` between tries: a service that
restarts within the deadline loses nothing. A request that still fails at the deadline (or gets
a final error: another 4xx, a malformed answer) fails only its own items: they get
:func:`~zbrl.rewards.base.failed_result` (reward NaN, ``failed=True``), which the producer
counts and the buffer never trains (their groups are dropped, ``reward_failed``); the request is
counted in :attr:`RemoteHttpReward.failures`, with a warning, and never stops a producer.
:meth:`RemoteHttpReward.check` (pre-flight) raises a :class:`RemoteRewardError` naming the URL
when the service does not answer.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import math
import threading
import time
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from zbrl.rewards.base import (
    BaseReward,
    Example,
    RewardBatch,
    RewardFunction,
    RewardResult,
    failed_result,
)
from zbrl.rewards.registry import register_reward

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
"""HTTP statuses worth another try (overload, restart); any other error status is final."""


class RemoteRewardError(RuntimeError):
    """The reward service could not be reached or answered something unusable."""


class _Retryable(RemoteRewardError):
    """A failure another try may cure (connection refused, timeout, 429, 5xx)."""


@register_reward("http")
class RemoteHttpReward(BaseReward):
    """Scores responses with a remote HTTP service (see the module docstring for the protocol)."""

    name = "http"

    def __init__(
        self,
        url: str,
        *,
        batch_size: int = 32,
        max_concurrency: int = 4,
        timeout_s: float = 30.0,
        backoff_s: float = 0.25,
        max_backoff_s: float = 4.0,
        headers: Mapping[str, str] | None = None,
        verifier: RewardFunction | None = None,
    ) -> None:
        """``verifier``: a verifiable reward that sets ``format_acc``, ``ans_acc`` and ``parsed``
        (metrics) while the reward stays the service's score."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"http reward: url {url!r} is not an http:// or https:// URL")
        if batch_size < 1 or max_concurrency < 1:
            raise ValueError("http reward: batch_size and max_concurrency must be >= 1")
        if not (timeout_s > 0 and backoff_s > 0 and max_backoff_s >= backoff_s):
            raise ValueError(
                "http reward: timeout_s and backoff_s must be > 0 and max_backoff_s >= backoff_s"
            )
        self.url = url
        self._parsed = parsed
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.headers = {"Content-Type": "application/json", **dict(headers or {})}
        self.verifier = verifier
        self.failures = 0
        """Requests that failed for good (at the deadline, or with a final error)."""
        self.retries_made = 0
        """Tries after a retryable failure, over all requests."""
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    # ---------------------------------------------------------------- pre-flight

    def check(self) -> None:
        """One request with an empty batch, one try, within ``timeout_s``: a
        :class:`RemoteRewardError` naming the URL and the fix when the service does not answer
        it with ``{"rewards": []}``."""
        try:
            self._post_once([], time.monotonic() + self.timeout_s, expected=0)
        except RemoteRewardError as exc:
            raise RemoteRewardError(
                f"reward service {self.url} is not usable: {exc}. Start the service (or fix "
                f"reward.url), or set reward.check_at_start=false to start anyway"
            ) from None

    # ---------------------------------------------------------------- scoring

    def score_responses(self, batch: RewardBatch) -> list[RewardResult]:
        deadline = time.monotonic() + self.timeout_s
        items = [_item(r, e) for r, e in zip(batch.responses, batch.examples)]
        chunks = [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        pool = self._executor()
        futures = [pool.submit(self._post_with_retries, chunk, deadline) for chunk in chunks]
        scored: list[RewardResult] = []
        for chunk, future in zip(chunks, futures):
            try:
                scored += future.result()
            except RemoteRewardError as exc:
                self._count_failure(len(chunk), str(exc))
                scored += [failed_result(str(exc)) for _ in chunk]
        if self.verifier is None:
            return scored
        checked = self.verifier.score_batch(*batch)
        return [_verified(r, c) for r, c in zip(scored, checked, strict=True)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="http-rw")
            return self._pool

    def _count_failure(self, n: int, reason: str) -> None:
        with self._lock:
            self.failures += 1
            count = self.failures
        logger.warning(
            "http reward %s: no score for %d response(s): %s (%d failed request(s) so far); "
            "their groups are not trained",
            self.url, n, reason, count,
        )  # fmt: skip

    def _post_with_retries(
        self, items: list[dict[str, Any]], deadline: float
    ) -> list[RewardResult]:
        """The request's results, tried again after each retryable failure (waits doubling from
        ``backoff_s``, capped at ``max_backoff_s``) until the deadline; the last try is made at
        the deadline's edge, so a service back by then still answers."""
        attempt = 0
        while True:
            try:
                return self._post_once(items, deadline, expected=len(items))
            except _Retryable as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0.05:
                    tries = f"{attempt + 1} {'try' if attempt == 0 else 'tries'}"
                    raise RemoteRewardError(
                        f"{exc} (after {tries} within reward.timeout_s={self.timeout_s} s)"
                    ) from None
                wait = min(self.backoff_s * 2**attempt, self.max_backoff_s, remaining - 0.05)
                attempt += 1
                with self._lock:
                    self.retries_made += 1
                time.sleep(wait)

    def _post_once(
        self, items: list[dict[str, Any]], deadline: float, *, expected: int
    ) -> list[RewardResult]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RemoteRewardError(f"deadline of {self.timeout_s} s (reward.timeout_s) passed")
        body = json.dumps({"items": items}).encode()
        cls = (
            http.client.HTTPSConnection
            if self._parsed.scheme == "https"
            else http.client.HTTPConnection
        )
        conn = cls(self._parsed.hostname, self._parsed.port, timeout=remaining)
        path = self._parsed.path or "/"
        if self._parsed.query:
            path += "?" + self._parsed.query
        try:
            conn.request("POST", path, body=body, headers=self.headers)
            reply = conn.getresponse()
            data = reply.read()
        except TimeoutError:
            raise _Retryable(f"no answer within the deadline ({self.timeout_s} s)") from None
        except OSError as exc:  # refused, reset, unreachable
            raise _Retryable(f"cannot connect: {exc}") from None
        except http.client.HTTPException as exc:
            raise _Retryable(f"bad HTTP exchange: {exc!r}") from None
        finally:
            conn.close()
        if reply.status in RETRY_STATUSES:
            raise _Retryable(f"HTTP {reply.status} {reply.reason}")
        if reply.status != 200:
            raise RemoteRewardError(f"HTTP {reply.status} {reply.reason}: {data[:200]!r}")
        return _parse_reply(data, expected)


def _verified(result: RewardResult, checked: RewardResult) -> RewardResult:
    """The service's result with a verifier's accuracies and parsed answer (a failed result
    stays failed: the accuracies are metrics, never a score)."""
    return dataclasses.replace(
        result, format_acc=checked.format_acc, ans_acc=checked.ans_acc, parsed=checked.parsed
    )


def _item(response: str, example: Example) -> dict[str, Any]:
    gt = example.get("gt_answer") if isinstance(example, Mapping) else None
    return {
        "prompt": list(example.get("messages", [])),
        "response": response,
        "gt_answer": gt if isinstance(gt, str) else None,
        "fields": _jsonable(example.get("fields", {})),
    }


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return {}


def _parse_reply(data: bytes, expected: int) -> list[RewardResult]:
    try:
        payload = json.loads(data)
    except ValueError:
        raise RemoteRewardError(f"the answer is not JSON: {data[:200]!r}") from None
    rewards = payload.get("rewards") if isinstance(payload, dict) else None
    if not isinstance(rewards, list) or len(rewards) != expected:
        raise RemoteRewardError(
            f'the answer must be {{"rewards": [...]}} with {expected} number(s); got {data[:200]!r}'
        )
    columns = {}
    for key in ("format_acc", "ans_acc"):
        column = payload.get(key)
        if column is not None and (not isinstance(column, list) or len(column) != expected):
            raise RemoteRewardError(f'"{key}" must be a list of {expected} number(s)')
        columns[key] = column
    results = []
    for i, value in enumerate(rewards):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise RemoteRewardError(f"reward {i} is {value!r}, not a finite number")
        clipped = min(max(float(value), 0.0), 1.0)
        fmt = columns["format_acc"][i] if columns["format_acc"] is not None else 1.0
        acc = columns["ans_acc"][i] if columns["ans_acc"] is not None else clipped
        results.append(RewardResult(float(value), float(fmt), float(acc)))
    return results
