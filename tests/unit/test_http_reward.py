"""The HTTP reward against a loopback server the tests start and stop."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flaky_reward_server import Faults, FlakyRewardServer, length_scorer, reward_scorer
from zbrl.rewards import http as http_module
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


def test_scores_in_batches_and_fails_cleanly_when_the_server_stops(server):
    reward = RemoteHttpReward(server.url, batch_size=3, backoff_s=0.01, timeout_s=5)
    reward.check()
    responses, examples, contexts = _batch(7)
    results = reward.score_batch(responses, examples, contexts)
    assert [r.reward for r in results] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert [r.ans_acc for r in results] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert not any(r.failed for r in results)
    assert sorted(len(items) for items in server.requests) == [0, 1, 3, 3]  # check + 3 chunks
    assert server.requests[0] == []
    assert any(i["prompt"][0]["content"] == "3+1?" for items in server.requests for i in items)
    assert reward.failures == 0

    server.stop()
    with pytest.raises(RemoteRewardError, match=r"127\.0\.0\.1:\d+/score is not usable"):
        reward.check()
    quick = RemoteHttpReward(server.url, batch_size=3, backoff_s=0.01, timeout_s=0.3)
    results = quick.score_batch(responses, examples, contexts)  # during a run: no exception
    assert all(r.failed and math.isnan(r.reward) for r in results)  # never a score
    assert quick.failures == 3
    assert "cannot connect" in results[0].metadata["reward_error"]


def test_every_item_carries_its_gt_answer_and_fields_also_with_a_verifier():
    from zbrl.assembly.rewards import build_reward_fn
    from zbrl.config import RunConfig

    flaky = FlakyRewardServer(reward_scorer("think_answer_tags"))
    try:
        cfg = RunConfig.model_validate({"reward": {
            "type": "http", "url": flaky.url, "verifier": "think_answer_tags"}})  # fmt: skip
        reward = build_reward_fn(cfg)
        examples = [
            {"messages": [{"role": "user", "content": "1+1?"}], "gt_answer": "2",
             "fields": {"level": 3, "topic": "sums"}},
            {"messages": [{"role": "user", "content": "2+2?"}], "gt_answer": "4", "fields": {}},
        ]  # fmt: skip
        responses = ["<think>x</think><answer>2</answer>", "<think>x</think><answer>5</answer>"]
        results = reward.score_batch(responses, examples, [CTX] * 2)
        assert [(i["gt_answer"], i["fields"]) for i in flaky.items] == [
            ("2", {"level": 3, "topic": "sums"}), ("4", {})]  # fmt: skip
        assert [r.reward for r in results] == [1.0, 0.0]  # the service checked the answers
        assert [r.ans_acc for r in results] == [1.0, 0.0]  # the verifier's
    finally:
        flaky.stop()


def test_dropped_connections_and_503_are_retried_until_scored():
    flaky = FlakyRewardServer(
        reward_scorer("think_answer_tags"), Faults(drop_every=2, fail_every=2)
    )
    try:
        reward = RemoteHttpReward(flaky.url, batch_size=1, backoff_s=0.01, timeout_s=10)
        responses = [f"<think>x</think><answer>{i + 1}</answer>" for i in range(6)]
        examples = [{"messages": [], "gt_answer": str(i + 1)} for i in range(6)]
        results = reward.score_batch(responses, examples, [CTX] * 6)
        assert [r.reward for r in results] == [1.0] * 6
        assert reward.failures == 0
        stats = flaky.stats()
        assert stats["dropped"] > 0 and stats["answered_503"] > 0
        assert reward.retries_made == stats["dropped"] + stats["answered_503"]
    finally:
        flaky.stop()


def test_a_service_down_for_a_while_then_back_loses_nothing():
    flaky = FlakyRewardServer(reward_scorer("think_answer_tags"))
    try:
        flaky.go_down()
        threading.Timer(0.6, flaky.come_back).start()
        reward = RemoteHttpReward(flaky.url, backoff_s=0.01, max_backoff_s=0.1, timeout_s=10)
        results = reward.score_batch(["<think>x</think><answer>2</answer>"],
                                     [{"messages": [], "gt_answer": "2"}], [CTX])  # fmt: skip
        assert [r.reward for r in results] == [1.0] and not results[0].failed
        assert reward.retries_made >= 3  # more tries than the old fixed count of 3 retries...
        assert reward.failures == 0
    finally:
        flaky.stop()


def test_retries_continue_with_capped_backoff_until_the_deadline():
    flaky = FlakyRewardServer(reward_scorer("think_answer_tags"))
    flaky.stop()  # down for good
    reward = RemoteHttpReward(flaky.url, backoff_s=0.01, max_backoff_s=0.04, timeout_s=0.5)
    waits = []
    sleep = time.sleep
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(http_module.time, "sleep", lambda s: (waits.append(s), sleep(s)))
        results = reward.score_batch(*_batch(2))
    assert all(r.failed for r in results)
    assert waits[:3] == pytest.approx([0.01, 0.02, 0.04])
    assert max(waits) <= 0.04 + 1e-9  # capped
    assert len(waits) >= 5  # kept trying until the deadline, not a fixed count
    assert "within reward.timeout_s=0.5 s" in results[0].metadata["reward_error"]


def test_one_failed_request_fails_only_its_own_items():
    def scorer(items):
        if any(i["response"] == "poison" for i in items):
            return {"rewards": []}  # malformed: a final error for this request only
        return length_scorer(items)

    flaky = FlakyRewardServer(scorer)
    try:
        reward = RemoteHttpReward(flaky.url, batch_size=2, timeout_s=5)
        responses = ["a b", "c", "poison", "d", "e f g", "h"]
        results = reward.score_batch(responses, [{"messages": []}] * 6, [CTX] * 6)
        assert [r.failed for r in results] == [False, False, True, True, False, False]
        assert [r.reward for r in results if not r.failed] == [0.1, 0.05, 0.15, 0.05]
        assert reward.failures == 1
        assert "must be" in results[2].metadata["reward_error"]
    finally:
        flaky.stop()


def test_deadline_and_concurrency_limit(server):
    server.delay_s = 0.3
    reward = RemoteHttpReward(server.url, batch_size=1, max_concurrency=2, timeout_s=5)
    reward.score_batch(*_batch(4))
    assert server.max_in_flight == 2

    slow = RemoteHttpReward(server.url, timeout_s=0.1)
    results = slow.score_batch(*_batch(1))
    assert results[0].failed and "deadline" in results[0].metadata["reward_error"]


def test_bad_url_and_options_are_refused():
    with pytest.raises(ValueError, match="not an http"):
        RemoteHttpReward("ftp://example.org/x")
    with pytest.raises(ValueError, match="max_backoff_s >= backoff_s"):
        RemoteHttpReward("http://127.0.0.1:1/x", backoff_s=1.0, max_backoff_s=0.5)


def test_removed_fields_say_what_to_do():
    from zbrl.config import ConfigError, load_config

    for field, words in (("failure_reward", "group is dropped"), ("retries", "until the batch")):
        with pytest.raises(ConfigError, match=rf"reward\.{field}' was removed: .*{words}"):
            url = "reward.url=http://127.0.0.1:1/x"
            load_config(None, ["reward.type=http", url, f"reward.{field}=1"])


def test_preflight_names_the_url_and_the_run_scores_through_the_config(server):
    from zbrl.assembly.rewards import build_eval_reward_fn, build_reward_fn, check_reward
    from zbrl.config import RunConfig
    from zbrl.errors import RunError

    cfg = RunConfig.model_validate({"reward": {"type": "http", "url": server.url}})
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
