"""A remote reward: batches of (prompt, response) POSTed as JSON to a scoring service.

Request body: ``{"items": [{"prompt": [messages...], "response": str, "gt_answer": str | None,
"fields": {...}}, ...]}``; the service answers ``{"rewards": [number, ...]}``, one per item, in
order (optionally ``"ans_acc": [...]`` and ``"format_acc": [...]`` in [0, 1]).

A batch is split into requests of ``batch_size`` items, at most ``max_concurrency`` in flight
(a thread pool of the standard library's ``http.client``). A request that fails with a connection
error, a timeout, HTTP 429 or 5xx is retried up to ``retries`` times, waiting ``backoff_s``,
then twice that, and so on; nothing is retried past the batch's deadline ``timeout_s``. A request
that still fails scores its items with ``failure_reward`` and ``timed_out=True`` (the producer's
``reward_timeouts`` metric) and is counted in :attr:`RemoteHttpReward.failures`, with a warning:
a service that goes down during a run never stops a producer. :meth:`RemoteHttpReward.check`
(pre-flight) raises a :class:`RemoteRewardError` naming the URL when the service does not answer.
"""

from __future__ import annotations

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

from zbrl.rewards.base import BaseReward, Example, RewardBatch, RewardResult
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
        retries: int = 3,
        backoff_s: float = 0.25,
        headers: Mapping[str, str] | None = None,
        failure_reward: float = 0.0,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"http reward: url {url!r} is not an http:// or https:// URL")
        if batch_size < 1 or max_concurrency < 1 or retries < 0:
            raise ValueError(
                "http reward: batch_size and max_concurrency must be >= 1 and retries >= 0"
            )
        if not (timeout_s > 0 and backoff_s > 0):
            raise ValueError("http reward: timeout_s and backoff_s must be > 0")
        self.url = url
        self._parsed = parsed
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.headers = {"Content-Type": "application/json", **dict(headers or {})}
        self.failure_reward = failure_reward
        self.failures = 0
        """Requests that failed for good (after their retries or at the deadline)."""
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
        results: list[RewardResult] = []
        for chunk, future in zip(chunks, futures):
            try:
                results += future.result()
            except RemoteRewardError as exc:
                results += self._failed(len(chunk), str(exc))
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="http-rw")
            return self._pool

    def _failed(self, n: int, reason: str) -> list[RewardResult]:
        with self._lock:
            self.failures += 1
            count = self.failures
        logger.warning(
            "http reward %s: %d response(s) scored %g as failed: %s (%d failed request(s) so far)",
            self.url,
            n,
            self.failure_reward,
            reason,
            count,
        )
        failed = RewardResult(
            self.failure_reward, 0.0, 0.0, metadata={"reward_error": reason}, timed_out=True
        )
        return [failed] * n

    def _post_with_retries(
        self, items: list[dict[str, Any]], deadline: float
    ) -> list[RewardResult]:
        attempt = 0
        while True:
            try:
                return self._post_once(items, deadline, expected=len(items))
            except _Retryable as exc:
                wait = self.backoff_s * 2**attempt
                if attempt >= self.retries or time.monotonic() + wait >= deadline:
                    tries = f"{attempt + 1} {'try' if attempt == 0 else 'tries'}"
                    raise RemoteRewardError(f"{exc} (after {tries})") from None
                attempt += 1
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
