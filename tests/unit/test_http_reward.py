"""The HTTP reward against a loopback server the tests start and stop."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from zbrl.rewards.base import RewardContext
from zbrl.rewards.http import RemoteHttpReward, RemoteRewardError

CTX = RewardContext(response_tokens=3, max_new_tokens=8)


class ScoringServer:
    """Scores a response 1.0 when it contains its row's gt_answer; can fail or stall on demand."""

    def __init__(self) -> None:
        self.requests: list[list[dict]] = []
        self.fail_next = 0  # answer that many requests with 503
        self.delay_s = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    fail = server.fail_next > 0
                    server.fail_next -= fail
                    server.requests.append(body["items"])
                time.sleep(server.delay_s)
                with lock:
                    server.in_flight -= 1
                if fail:
                    self.send_response(503)
                    self.end_headers()
                    return
                rewards = [float(i["gt_answer"] in i["response"]) for i in body["items"]]
                data = json.dumps({"rewards": rewards}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.handle_error = lambda *args: None  # a client that gave up closed its socket
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server():
    s = ScoringServer()
    yield s
    s.stop()


def _batch(n: int):
    examples = [{"messages": [{"role": "user", "content": f"{i}+1?"}], "gt_answer": str(i + 1)}
                for i in range(n)]  # fmt: skip
    responses = [str(i + 1) if i % 2 == 0 else "no idea" for i in range(n)]
    return responses, examples, [CTX] * n


def test_scores_in_batches_and_passes_then_fails_cleanly_when_the_server_stops(server):
    reward = RemoteHttpReward(server.url, batch_size=3, retries=1, backoff_s=0.01, timeout_s=5)
    reward.check()
    responses, examples, contexts = _batch(7)
    results = reward.score_batch(responses, examples, contexts)
    assert [r.reward for r in results] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert [r.ans_acc for r in results] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert sorted(len(items) for items in server.requests) == [0, 1, 3, 3]  # check + 3 chunks
    assert server.requests[0] == []
    assert any(i["prompt"][0]["content"] == "3+1?" for items in server.requests for i in items)
    assert reward.failures == 0

    server.stop()
    with pytest.raises(RemoteRewardError, match=r"127\.0\.0\.1:\d+/score is not usable"):
        reward.check()
    results = reward.score_batch(responses, examples, contexts)  # during a run: no exception
    assert [r.reward for r in results] == [0.0] * 7
    assert all(r.timed_out for r in results)
    assert reward.failures == 3
    assert "cannot connect" in results[0].metadata["reward_error"]


def test_retries_with_backoff_after_503(server):
    server.fail_next = 2
    reward = RemoteHttpReward(server.url, retries=2, backoff_s=0.05, timeout_s=5)
    start = time.monotonic()
    results = reward.score_batch(*_batch(2))
    assert [r.reward for r in results] == [1.0, 0.0]
    assert len(server.requests) == 3
    assert time.monotonic() - start >= 0.05 + 0.1  # waited backoff, then twice that


def test_gives_up_after_its_retries(server):
    server.fail_next = 10
    reward = RemoteHttpReward(server.url, retries=1, backoff_s=0.01, failure_reward=-1.0)
    results = reward.score_batch(*_batch(2))
    assert [r.reward for r in results] == [-1.0, -1.0]
    assert len(server.requests) == 2
    assert "HTTP 503" in results[0].metadata["reward_error"]


def test_deadline_and_concurrency_limit(server):
    server.delay_s = 0.3
    reward = RemoteHttpReward(server.url, batch_size=1, max_concurrency=2, timeout_s=5)
    reward.score_batch(*_batch(4))
    assert server.max_in_flight == 2

    slow = RemoteHttpReward(server.url, timeout_s=0.1, retries=0)
    start = time.monotonic()
    results = slow.score_batch(*_batch(1))
    assert time.monotonic() - start < 0.3
    assert results[0].timed_out and "deadline" in results[0].metadata["reward_error"]


def test_a_malformed_answer_is_a_counted_failure(server):
    reward = RemoteHttpReward(server.url)
    reward._post_once = lambda items, deadline, expected: (_ for _ in ()).throw(  # type: ignore[method-assign]
        RemoteRewardError("the answer is not JSON")
    )
    results = reward.score_batch(*_batch(1))
    assert results[0].timed_out and reward.failures == 1


def test_bad_url_is_refused():
    with pytest.raises(ValueError, match="not an http"):
        RemoteHttpReward("ftp://example.org/x")


def test_preflight_names_the_url_and_the_run_scores_through_the_config(server):
    from zbrl.assembly.rewards import build_eval_reward_fn, build_reward_fn, check_reward
    from zbrl.config import RunConfig
    from zbrl.errors import RunError

    cfg = RunConfig.model_validate({"reward": {"type": "http", "url": server.url, "retries": 0}})
    check_reward(cfg)
    reward = build_reward_fn(cfg)
    assert [r.reward for r in reward.score_batch(*_batch(2))] == [1.0, 0.0]
    verified = cfg.model_copy(update={"reward": cfg.reward.model_copy(
        update={"verifier": "think_answer_tags"})})  # fmt: skip
    assert build_eval_reward_fn(verified).name == "think_answer_tags"
    server.stop()
    with pytest.raises(
        RunError, match=r"reward\.url: reward service http://127\.0\.0\.1:\d+/score"
    ):
        check_reward(cfg)
    unchecked = RunConfig.model_validate(
        {"reward": {"type": "http", "url": server.url, "check_at_start": False}}
    )
    check_reward(unchecked)  # starts anyway; failures are counted during the run
