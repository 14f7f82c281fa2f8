"""A loopback reward service with a fault schedule, for the ``http`` reward (docs/rewards.md).

It speaks the ``http`` reward's protocol (``{"items": [...]}`` in, ``{"rewards": [...],
"format_acc": [...], "ans_acc": [...]}`` out) and scores each item with a zbrl reward against the
item's ``gt_answer`` (default ``think_answer_tags``: the demo task's own scoring), or, with
``--reward length``, without any answer (open-ended prompts: the response's length in words over
20, capped at 1). Faults, counted over scoring requests (a request with no items, the run's
pre-flight check, is always answered):

* ``--drop-every K``: every K-th request is read and its connection closed without an answer;
* ``--fail-every K``: every K-th of the other requests is answered ``503 Service Unavailable``;
* ``--down-after-s T --down-for-s D``: T seconds after the first scoring request the service
  stops listening (connections are refused) for D seconds, then comes back on the same port.

    python bench/flaky_reward_server.py --port 8765 --drop-every 4 --fail-every 3 \\
        --down-after-s 60 --down-for-s 8
    zbrl train recipes/demo.yaml reward.type=http reward.url=http://127.0.0.1:8765/score \\
        reward.verifier=think_answer_tags

On SIGINT/SIGTERM it prints its counters as one JSON line (``--stats PATH`` also writes them).
Tests use :class:`FlakyRewardServer` in a thread.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Scorer = Callable[[Sequence[dict[str, Any]]], dict[str, list[float]]]
"""Items → ``{"rewards": [...], ...}`` (the reply's body)."""


@dataclass
class Faults:
    """The fault schedule (0 turns a fault off)."""

    drop_every: int = 0
    fail_every: int = 0
    down_after_s: float = 0.0
    down_for_s: float = 0.0


@dataclass
class Counters:
    """What the service saw and did."""

    requests: int = 0
    """Scoring requests received (items > 0)."""
    dropped: int = 0
    answered_503: int = 0
    scored_requests: int = 0
    scored_items: int = 0
    items_without_gt_answer: int = 0
    outages: int = 0


def reward_scorer(name: str) -> Scorer:
    """A scorer from a registered zbrl reward scoring each item against its ``gt_answer``."""
    from zbrl.rewards import RewardContext, build_reward

    reward = build_reward(name)
    ctx = RewardContext(response_tokens=0, max_new_tokens=1 << 30)

    def score(items: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
        examples = [{"messages": i["prompt"], "gt_answer": i["gt_answer"]} for i in items]
        results = reward.score_batch([i["response"] for i in items], examples, [ctx] * len(items))
        return {
            "rewards": [r.reward for r in results],
            "format_acc": [r.format_acc for r in results],
            "ans_acc": [r.ans_acc for r in results],
        }

    return score


def length_scorer(items: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """An answer-free score: the response's words / 20, capped at 1."""
    return {"rewards": [min(1.0, len(i["response"].split()) / 20) for i in items]}


class FlakyRewardServer:
    """The service on ``127.0.0.1:port`` (0: any free port) in a background thread."""

    def __init__(self, scorer: Scorer, faults: Faults | None = None, port: int = 0) -> None:
        self.scorer = scorer
        self.faults = faults or Faults()
        self.counters = Counters()
        self.items: list[dict[str, Any]] = []
        """Every item of every scoring request received (what the service was sent)."""
        self._lock = threading.Lock()
        self._first_request: float | None = None
        self._httpd = self._listen(port)
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/score"
        self._thread = self._serve()
        self._closed = False

    # ------------------------------------------------------------------ serving

    def _listen(self, port: int) -> ThreadingHTTPServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                action = server._admit(body["items"])
                if action == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if action == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(
                    server.scorer(body["items"]) if body["items"] else {"rewards": []}
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        httpd.daemon_threads = True
        httpd.handle_error = lambda *args: None  # type: ignore[method-assign]  # a client gave up
        return httpd

    def _serve(self) -> threading.Thread:
        thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="flaky-reward", daemon=True
        )
        thread.start()
        return thread

    def _admit(self, items: list[dict[str, Any]]) -> str:
        """``drop``, ``503`` or ``score`` for a request (counted); an empty one is scored."""
        if not items:
            return "score"
        f, c = self.faults, self.counters
        with self._lock:
            if self._first_request is None:
                self._first_request = time.monotonic()
                if f.down_for_s > 0:
                    threading.Timer(f.down_after_s, self._outage).start()
            c.requests += 1
            self.items += items
            c.items_without_gt_answer += sum(i.get("gt_answer") is None for i in items)
            if f.drop_every and c.requests % f.drop_every == 0:
                c.dropped += 1
                return "drop"
            kept = c.requests - c.dropped
            if f.fail_every and kept % f.fail_every == 0:
                c.answered_503 += 1
                return "503"
            c.scored_requests += 1
            c.scored_items += len(items)
            return "score"

    def _outage(self) -> None:
        """Stop listening for ``down_for_s`` seconds, then listen again on the same port."""
        if self._closed:
            return
        self.counters.outages += 1
        self.go_down()
        time.sleep(self.faults.down_for_s)
        if not self._closed:
            self.come_back()

    def go_down(self) -> None:
        """Stop listening: new connections are refused until :meth:`come_back`."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def come_back(self) -> None:
        """Listen again on the same port."""
        self._httpd = self._listen(self.port)
        self._thread = self._serve()

    def stop(self) -> None:
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def stats(self) -> dict[str, Any]:
        return asdict(self.counters)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--reward",
        default="think_answer_tags",
        help="a registered zbrl reward scoring against gt_answer, or 'length' (no answer)",
    )
    parser.add_argument("--drop-every", type=int, default=0)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--down-after-s", type=float, default=0.0)
    parser.add_argument("--down-for-s", type=float, default=0.0)
    parser.add_argument("--stats", help="write the counters here as JSON on exit")
    args = parser.parse_args(argv)
    scorer = length_scorer if args.reward == "length" else reward_scorer(args.reward)
    faults = Faults(args.drop_every, args.fail_every, args.down_after_s, args.down_for_s)
    server = FlakyRewardServer(scorer, faults, port=args.port)
    print(f"[flaky_reward_server] listening on {server.url}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop()
    line = json.dumps(server.stats())
    print(f"[flaky_reward_server] {line}", flush=True)
    if args.stats:
        with open(args.stats, "w") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":
    main()
