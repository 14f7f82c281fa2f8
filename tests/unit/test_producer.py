"""Producer against a stub backend and stub reward, a real RolloutBuffer and weight receiver
(in-process handles, no Ray)."""

import itertools
import math
import pickle
import threading
import time

import pytest
import torch
from role_settings import buffer_settings, producer_settings, sampling_params, single_turn

from zbrl.rewards.base import BaseReward, RewardResult, failed_result
from zbrl.rollout import producer as producer_module
from zbrl.rollout.backends.base import Completion
from zbrl.rollout.producer import Producer
from zbrl.telemetry.spans import SpanRecorder
from zbrl.transport.buffer import RolloutBuffer
from zbrl.transport.clients import BufferClient, WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.object_store import ObjectStoreReceiver
from zbrl.transport.weight_sync.store import WeightStore
from zbrl.types import EncodedPrompt, WeightsMessage

BASE = 100  # prompt i starts with token BASE + i
MAX_NEW = 3
G = 4
WAIT = 10.0


class StubBackend:
    """Completion j of prompt i: j + 1 tokens (capped at max_new_tokens), ids 1000*i + 10*j + k,
    logprobs -(k + 1)/10 - w where w is the loaded weight ``w``; text = str(i) for even j."""

    def __init__(self):
        self.weight = 0.0
        self.generate_calls = []  # (prompt ids, params, weight in force)
        self.loaded = []

    def generate(self, prompts, params):
        self.generate_calls.append(([list(p) for p in prompts], params, self.weight))
        out = []
        for p in prompts:
            i = p[0] - BASE
            comps = []
            for j in range(params.n):
                length = min(j + 1, params.max_new_tokens)
                ids = torch.tensor([1000 * i + 10 * j + k for k in range(length)])
                logprobs = -(torch.arange(length, dtype=torch.float32) + 1) / 10 - self.weight
                text = str(i) if j % 2 == 0 else "wrong"
                finish = "length" if length == params.max_new_tokens else "stop"
                comps.append(Completion(ids, logprobs, text, finish))
            out.append(comps)
        return out

    def load_weights(self, named_tensors):
        self.loaded.append(named_tensors)
        self.weight = float(named_tensors["w"])

    def release_memory(self):
        pass


class StubReward(BaseReward):
    name = "stub"

    def __init__(self):
        self.contexts = []

    def score(self, response, example, ctx):
        self.contexts.append(ctx)
        correct = response == example["gt_answer"]
        reward = (1.0 if correct else -0.5) - (0.25 if ctx.truncated else 0.0)
        return RewardResult(
            reward=reward, format_acc=0.0 if ctx.truncated else 1.0, ans_acc=float(correct)
        )


class Rig:
    """One buffer + store shared by the producers built from it."""

    def __init__(self, *, num_prompts, groups_per_step=2, max_staleness=100, num_producers=1):
        self.prompts = [
            EncodedPrompt(
                uid=f"train.jsonl:{i + 1}",
                prompt_ids=[BASE + i] + [7] * (i % 3),
                example={"gt_answer": str(i)},
            )
            for i in range(num_prompts)
        ]
        self.buffer = RolloutBuffer(
            buffer_settings(
                groups_per_step=groups_per_step,
                max_staleness=max_staleness,
                num_producers=num_producers,
            )
        )
        self.finished = []
        original = self.buffer.producer_finished

        def finished(index):
            self.finished.append(index)
            original(index)

        self.buffer.producer_finished = finished
        self.store = WeightStore()
        self.receivers = []

    def producer(self, index=0, num_producers=1, **overrides):
        kw = dict(
            index=index,
            num_producers=num_producers,
            sampling=sampling_params(n=G, temperature=1.0, max_new_tokens=MAX_NEW),
            inference_batch_size=2,
            inference_microbatch_size=1,
            num_epochs=1,
            seed=0,
            shuffle=True,
        )
        kw.update(overrides)
        receiver = ObjectStoreReceiver(
            WeightStoreClient(LocalHandle(self.store)), poll_interval_s=0.01, initial_version=0
        )
        self.receivers.append(receiver)
        backend, reward = StubBackend(), StubReward()
        producer = Producer(
            producer_settings(**kw),
            self.prompts,
            backend,
            reward,
            BufferClient(LocalHandle(self.buffer)),
            receiver,
            SpanRecorder(f"producer-{index}", "producer"),
            single_turn(kw["sampling"]),
        )
        return producer, backend, reward

    def publish(self, version, w):
        self.store.put(WeightsMessage(version, time.time(), {"w": torch.tensor(float(w))}))

    def take_all(self, n):
        groups = []
        while True:
            status, batch = self.buffer.take(n, timeout=0)
            if status != "batch":
                return groups, status
            groups += batch.groups

    def close(self):
        for r in self.receivers:
            r.close()


@pytest.fixture
def rig_factory(monkeypatch):
    monkeypatch.setattr(producer_module, "POLL_TIMEOUT_S", 0.05)  # re-check waits often
    rigs = []

    def make(**kw):
        rig = Rig(**kw)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


def prompt_index(group):
    return group.prompt_ids[0] - BASE


def test_one_group_per_prompt_with_g_variable_length_completions(rig_factory):
    rig = rig_factory(num_prompts=5)
    producer, backend, reward = rig.producer()
    result = producer.run()
    assert (result.index, result.groups, result.samples) == (0, 5, 5 * G)
    groups, status = rig.take_all(5)
    assert status == "end"
    assert sorted(prompt_index(g) for g in groups) == [0, 1, 2, 3, 4]
    for group in groups:
        i = prompt_index(group)
        assert group.prompt_ids == rig.prompts[i].prompt_ids
        assert group.uid == f"train.jsonl:{i + 1}@e0"
        assert group.group_size == G
        assert group.response_lengths == [1, 2, 3, 3]  # kept as sampled: no padding
        for j, ids in enumerate(group.response_ids):
            assert ids.tolist() == [1000 * i + 10 * j + k for k in range(len(ids))]
            expected = -(torch.arange(len(ids), dtype=torch.float32) + 1) / 10
            assert torch.equal(group.behaviour_logprobs[j], expected)
        assert group.response_texts == [str(i), "wrong", str(i), "wrong"]
        assert group.truncated == [False, False, True, True]
        assert group.rewards == [1.0, -0.5, 0.75, -0.75]
        assert group.format_acc == [1.0, 1.0, 0.0, 0.0]
        assert group.ans_acc == [1.0, 0.0, 1.0, 0.0]
        assert group.policy_version == 0
        assert group.temperature == 1.0
        assert group.producer == 0
    # the reward saw the generation context of every response
    assert len(reward.contexts) == 5 * G
    assert [c.response_tokens for c in reward.contexts[:G]] == [1, 2, 3, 3]
    assert all(c.max_new_tokens == MAX_NEW for c in reward.contexts)
    # microbatch size 1: one generate call per prompt, each asking for G samples
    assert len(backend.generate_calls) == 5
    assert all(params.n == G for _, params, _ in backend.generate_calls)


def test_tickets_are_consumed_in_order_and_data_end_releases_the_rest(rig_factory):
    rig = rig_factory(num_prompts=5, groups_per_step=2)
    producer, _, _ = rig.producer(inference_batch_size=2)
    producer.run()
    # reservations [0, 1], [2, 3], [4, 5 released], [6, 7 released]
    assert rig.finished == [0]
    assert rig.buffer.stats.tickets_released == 3
    snap = rig.buffer.snapshot()
    assert snap["pending_groups"] == 0 and snap["buffered_groups"] == 5
    batches = []
    while True:
        status, batch = rig.buffer.take(2, timeout=0)
        if status != "batch":
            break
        batches.append(batch)
    assert status == "end"
    assert [len(b.groups) for b in batches] == [2, 2, 1]
    assert [b.partial for b in batches] == [False, False, True]
    assert [g.ticket for b in batches for g in b.groups] == [0, 1, 2, 3, 4]


def test_data_ending_inside_a_micro_batch_keeps_tickets_and_prompts_paired(rig_factory):
    rig = rig_factory(num_prompts=5, groups_per_step=2)
    producer, backend, _ = rig.producer(inference_batch_size=4, inference_microbatch_size=4)
    producer.run()
    # reservations [0..3] (4 prompts), [4, 5-7 released]: one prompt in a chunk of 4 tickets
    assert [len(prompts) for prompts, _, _ in backend.generate_calls] == [4, 1]
    groups, status = rig.take_all(2)
    assert status == "end"
    assert [g.ticket for g in groups] == [0, 1, 2, 3, 4]


def test_inference_micro_batches_split_each_reservation(rig_factory):
    rig = rig_factory(num_prompts=5, groups_per_step=3)
    producer, backend, _ = rig.producer(inference_batch_size=3, inference_microbatch_size=2)
    producer.run()
    # reservations [0, 1, 2] -> chunks of 2 + 1; [3, 4, 5 released] -> one chunk of 2;
    # [6, 7, 8] all released
    assert [len(prompts) for prompts, _, _ in backend.generate_calls] == [2, 1, 2]
    assert rig.buffer.stats.tickets_released == 4
    groups, status = rig.take_all(3)
    assert status == "end"
    assert [g.ticket for g in groups] == [0, 1, 2, 3, 4]
    served = [p for prompts, _, _ in backend.generate_calls for p in prompts]
    assert [g.prompt_ids for g in groups] == served


def test_two_producers_cover_disjoint_shards_once_per_epoch(rig_factory):
    rig = rig_factory(num_prompts=7, num_producers=2)
    p0, _, _ = rig.producer(index=0, num_producers=2, num_epochs=2)
    p1, _, _ = rig.producer(index=1, num_producers=2, num_epochs=2)
    r0, r1 = p0.run(), p1.run()
    assert r0.groups + r1.groups == 14
    assert sorted(rig.finished) == [0, 1]
    groups, status = rig.take_all(2)
    assert status == "end"
    for epoch in (0, 1):
        in_epoch = [g for g in groups if g.uid.endswith(f"@e{epoch}")]
        by_producer = {k: {prompt_index(g) for g in in_epoch if g.producer == k} for k in (0, 1)}
        assert not by_producer[0] & by_producer[1]
        assert by_producer[0] | by_producer[1] == set(range(7))
        assert len(in_epoch) == 7
    assert len({g.uid for g in groups}) == 14


def test_newer_weights_are_loaded_between_batches(rig_factory):
    rig = rig_factory(num_prompts=6)
    producer, backend, _ = rig.producer(inference_batch_size=2)
    assert producer.step()
    assert backend.loaded == [] and producer.versions_loaded == 0
    rig.publish(1, 0.5)
    assert producer.receiver.wait_for(1, timeout=WAIT)
    assert producer.step()
    assert len(backend.loaded) == 1
    assert backend.loaded[0] is rig.store.latest().payload
    assert producer.versions_loaded == 1 and producer.receiver.loaded_version == 1
    assert producer.step()  # nothing newer: no reload
    assert producer.versions_loaded == 1
    groups, _ = rig.take_all(6)
    assert [g.policy_version for g in groups] == [0, 0, 1, 1, 1, 1]
    # behaviour logprobs come from the weights in force when the group was generated
    assert groups[0].behaviour_logprobs[0].item() == pytest.approx(-0.1)
    assert groups[2].behaviour_logprobs[0].item() == pytest.approx(-0.6)
    result = producer.run()
    assert result.weight_versions_loaded == 1 and len(result.weight_sync_latencies_s) == 1


def test_staleness_zero_waits_for_required_version(rig_factory):
    rig = rig_factory(num_prompts=4, groups_per_step=2, max_staleness=0)
    producer, backend, _ = rig.producer(inference_batch_size=2)
    assert producer.step()
    status, batch = rig.buffer.take(2, timeout=0)
    assert status == "batch" and [g.policy_version for g in batch.groups] == [0, 0]
    rig.buffer.advance_version(1)  # the consumer stepped; its weights are not published yet
    publisher = threading.Timer(0.1, rig.publish, args=(1, 2.0))
    publisher.start()
    assert producer.step()  # must block until v1 arrives, then generate with it
    publisher.join()
    assert [w for _, _, w in backend.generate_calls] == [0.0, 0.0, 2.0, 2.0]
    status, batch = rig.buffer.take(2, timeout=0)
    assert status == "batch" and [g.policy_version for g in batch.groups] == [1, 1]
    spans = producer.recorder.drain()
    assert any(
        s["name"] == "wait_for_weights" and s["attrs"].get("reason") == "staleness" for s in spans
    )


def test_admission_blocks_until_consumer_advances_and_close_stops(rig_factory):
    rig = rig_factory(num_prompts=8, groups_per_step=2, max_staleness=0)
    producer, _, _ = rig.producer(inference_batch_size=2)
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=producer.run()))
    thread.start()
    # only one step of groups may be started before the consumer advances
    deadline = time.monotonic() + WAIT
    while rig.buffer.snapshot()["buffered_groups"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread.is_alive()
    assert rig.buffer.snapshot()["buffered_groups"] == 2
    rig.buffer.close()
    thread.join(timeout=WAIT)
    assert not thread.is_alive()
    assert result["r"].groups == 2
    assert rig.finished == [0]


def test_temperature_anneals_over_first_epoch(rig_factory):
    rig = rig_factory(num_prompts=8)
    producer, backend, _ = rig.producer(
        final_temperature=0.5, anneal_fraction=1.0, num_epochs=2, inference_batch_size=2
    )
    producer.run()
    groups, _ = rig.take_all(2)
    temps = [g.temperature for g in sorted(groups, key=lambda g: g.ticket)]
    expected_first = [1.0 - 0.5 * k / 8 for k in range(8)]
    assert temps[:8] == pytest.approx(expected_first)
    assert all(b < a for a, b in itertools.pairwise(temps[:8]))
    assert temps[8:] == pytest.approx([0.5] * 8)
    # the backend sampled at the group's temperature
    assert [params.temperature for _, params, _ in backend.generate_calls] == pytest.approx(temps)


def test_temperature_anneal_fraction_reaches_final_early(rig_factory):
    rig = rig_factory(num_prompts=8)
    producer, _, _ = rig.producer(final_temperature=0.2, anneal_fraction=0.5)
    producer.run()
    groups, _ = rig.take_all(2)
    temps = [g.temperature for g in sorted(groups, key=lambda g: g.ticket)]
    assert temps == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2, 0.2])


def test_constant_temperature_without_annealing(rig_factory):
    rig = rig_factory(num_prompts=4)
    producer, backend, _ = rig.producer(num_epochs=2)
    producer.run()
    groups, _ = rig.take_all(2)
    assert {g.temperature for g in groups} == {1.0}
    assert {params.temperature for _, params, _ in backend.generate_calls} == {1.0}


def test_producer_state_round_trip_continues_exactly(rig_factory):
    settings = dict(final_temperature=0.5, num_epochs=2, inference_batch_size=2)
    rig = rig_factory(num_prompts=7)
    original, _, _ = rig.producer(**settings)
    assert original.step() and original.step()  # 4 prompts of the first epoch taken
    state = pickle.loads(pickle.dumps(original.state()))
    assert state["sampler"] == {"epoch": 0, "position": 4}
    assert (state["prompts_taken"], state["groups_pushed"], state["samples_pushed"]) == (
        4,
        4,
        4 * G,
    )

    resumed_rig = rig_factory(num_prompts=7)
    resumed, _, _ = resumed_rig.producer(**settings)
    resumed.load_state(state)
    expected, got = original.run(), resumed.run()
    assert (got.groups, got.samples) == (expected.groups, expected.samples) == (14, 14 * G)
    rest = sorted(rig.take_all(2)[0], key=lambda g: g.ticket)[4:]
    resumed_groups = sorted(resumed_rig.take_all(2)[0], key=lambda g: g.ticket)
    # the same prompts, in the same order, at the same point of the temperature schedule
    assert [g.uid for g in resumed_groups] == [g.uid for g in rest]
    assert [g.temperature for g in resumed_groups] == [g.temperature for g in rest]
    assert [g.prompt_ids for g in resumed_groups] == [g.prompt_ids for g in rest]
    assert rest[0].temperature < 1.0 and rest[-1].temperature == 0.5


def test_reward_timeouts_are_counted_per_group_and_summed_in_the_batch_metrics(rig_factory):
    """Issue 15: a user reward that misses its deadline is a failed score *and* a metric."""
    rig = rig_factory(num_prompts=2, groups_per_step=2)
    producer, _, reward = rig.producer()
    scored = reward.score

    def flaky(response, example, ctx):  # the truncated responses time out
        if ctx.truncated:
            return RewardResult(0.0, 0.0, 0.0, timed_out=True)
        return scored(response, example, ctx)

    reward.score = flaky
    producer.run()
    status, batch = rig.buffer.take(2, 1.0)
    assert status == "batch"
    assert [g.reward_timeouts for g in batch.groups] == [2, 2]  # 2 of G=4 truncated per group
    assert batch.raw_metrics["reward_timeouts"] == 4.0


def test_a_group_whose_reward_failed_is_dropped_counted_and_replaced(rig_factory):
    """Issue 30: a response without a score (a service down, a worker dead) is never trained:
    its group is dropped and counted, and the producer makes a replacement group."""
    rig = rig_factory(num_prompts=4, groups_per_step=3)
    producer, _, reward = rig.producer(shuffle=False)
    scored = reward.score

    def down_for_prompt_1(response, example, ctx):
        if example["gt_answer"] == "1" and ctx.truncated:
            return failed_result("service down")
        return scored(response, example, ctx)

    reward.score = down_for_prompt_1
    producer.run()
    status, batch = rig.buffer.take(3, 1.0)
    assert status == "batch" and not batch.partial
    assert sorted(prompt_index(g) for g in batch.groups) == [0, 2, 3]  # 1 dropped, 3 replaced it
    assert all(not any(math.isnan(r) for r in g.rewards) for g in batch.groups)
    assert batch.raw_metrics["reward_failed"] == 2.0  # 2 of G=4 truncated in the failed group
    stats = rig.buffer.stats.as_dict()
    assert stats["groups_dropped_reward_failed"] == 1.0
    assert stats["responses_reward_failed"] == 2.0
    assert stats["responses_reward_failed_trained"] == 0.0
    assert rig.buffer.stats.per_reason == {"reward_failed": 1}


def test_through_an_http_reward_only_the_failed_requests_group_is_dropped(rig_factory):
    """The http reward's request for one group fails for good: that group alone is dropped and
    counted; the others are trained with the service's scores."""
    from flaky_reward_server import FlakyRewardServer
    from zbrl.rewards.http import RemoteHttpReward

    def scorer(items):
        if any(i["gt_answer"] == "1" for i in items):
            return {"rewards": []}  # malformed: a final error for this request only
        return {"rewards": [float(i["response"] == i["gt_answer"]) for i in items]}

    service = FlakyRewardServer(scorer)
    try:
        rig = rig_factory(num_prompts=4, groups_per_step=3)
        producer, _, _ = rig.producer(shuffle=False, inference_microbatch_size=2)
        producer.reward = RemoteHttpReward(service.url, batch_size=G, timeout_s=5)
        producer.run()
    finally:
        service.stop()
    status, batch = rig.buffer.take(3, 1.0)
    assert status == "batch"
    assert sorted(prompt_index(g) for g in batch.groups) == [0, 2, 3]
    assert all(g.rewards == [1.0, 0.0, 1.0, 0.0] for g in batch.groups)
    assert rig.buffer.stats.groups_dropped_reward_failed == 1
    assert rig.buffer.stats.responses_reward_failed == G


class ChunkingBackend(StubBackend):
    """With in-flight updates: its generations take two advances, the first sampling one token
    under the version the producer loaded before the start (``between`` runs in it, e.g.
    publishing a version), the rest under the version loaded after it."""

    def __init__(self, between):
        super().__init__()
        self.between = between
        self.inflight_calls = 0

    def start(self, prompts, params, version, keep_cache):
        self.inflight_calls += 1
        return TwoChunks(self, prompts, params, version)


class TwoChunks:
    """The stepping handle of :class:`ChunkingBackend`."""

    def __init__(self, backend, prompts, params, version):
        self.backend, self.prompts, self.params = backend, prompts, params
        self.versions = [version]
        self.done = False
        self.advanced = False

    def advance(self, steps):
        if not self.advanced:
            self.backend.between()
            self.advanced = True
        else:
            self.done = True

    def weights_loaded(self, version):
        self.versions.append(version)

    def results(self):
        first, second = self.versions[0], self.versions[-1]
        out = StubBackend.generate(self.backend, self.prompts, self.params)
        for comps in out:
            for c in comps:
                n = c.token_ids.numel()
                c.versions = torch.tensor([first] + [second] * (n - 1), dtype=torch.long)[:n]
        return out

    def close(self):
        pass


def test_inflight_updates_swap_weights_inside_a_generation(rig_factory):
    rig = rig_factory(num_prompts=2)
    producer, _, _ = rig.producer(inflight_chunk_tokens=1, inference_batch_size=1)
    receiver = rig.receivers[-1]

    def publish_once():
        if receiver.loaded_version == 0:
            rig.publish(1, w=0.5)
            assert receiver.wait_for(1, timeout=WAIT)

    backend = ChunkingBackend(publish_once)
    producer.backend = backend
    assert producer.step() and producer.step()
    groups, _ = rig.take_all(2)
    first, second = sorted(groups, key=lambda g: g.ticket)
    assert [v.tolist() for v in first.token_versions] == [[0], [0, 1], [0, 1, 1], [0, 1, 1]]
    assert first.policy_version == 0  # the oldest token's
    assert [v.tolist() for v in second.token_versions] == [[1], [1, 1], [1, 1, 1], [1, 1, 1]]
    assert second.policy_version == 1
    assert backend.loaded and float(backend.loaded[0]["w"]) == 0.5
    assert producer.versions_loaded == 1 and backend.inflight_calls == 2


def test_without_inflight_updates_generate_gets_no_swap_and_groups_one_version(rig_factory):
    rig = rig_factory(num_prompts=2)
    producer, backend, _ = rig.producer()
    producer.run()  # StubBackend.generate takes no ``inflight`` keyword: none may be passed
    groups, _ = rig.take_all(2)
    assert len(groups) == 2 and len(backend.generate_calls) == 2
    assert all(g.token_versions is None and g.policy_version == 0 for g in groups)
