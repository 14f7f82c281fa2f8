"""Idle consumers generate (``rollout.consumers_generate``): the planner's online model, the
consumer's own generation through the one rollout path (real buffer, real tiny model), and the
consumer's wait loop (stub trainer and generation; no Ray)."""

import threading

import pytest
import torch
from role_settings import consumer_settings, run_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from zbrl.assembly.consumer_generation import build_consumer_generation, consumer_generation_mode
from zbrl.config import load_config
from zbrl.config.loader import ConfigError
from zbrl.rewards.base import BaseReward, RewardResult
from zbrl.rollout.idle_planner import WARMUP_STEPS, IdleRates, OnlinePlanner, predict
from zbrl.telemetry.spans import GENERATE, WAIT_FOR_DATA, SpanRecorder
from zbrl.training import consumer as consumer_module
from zbrl.training.consumer import Consumer
from zbrl.transport.buffer import RolloutBuffer
from zbrl.transport.clients import BufferClient
from zbrl.transport.handles import LocalHandle
from zbrl.types import EncodedPrompt, RolloutGroup, TrainBatch

# -- the planner's model -----------------------------------------------------------------------


def rates(**kw):
    base = dict(
        train_s=1.0,
        batch_groups=8,
        producer_groups_per_s=4.0,
        producer_groups_per_s_on=None,
        consumer_groups_per_s=None,
    )
    base.update(kw)
    return IdleRates(**base)


def test_producer_bound_generation_shortens_the_step():
    p = predict(rates(consumer_groups_per_s=8.0))
    assert p.step_s_off == pytest.approx(2.0)  # 8 groups at 4/s
    assert p.idle_off == pytest.approx(0.5)
    # 8 = 4 s + 8 (s - 1)  ->  s = 16/12
    assert p.step_s_on == pytest.approx(16 / 12)
    assert p.idle_on == 0.0 and p.generate


def test_consumer_bound_or_slow_generation_is_not_worth_it():
    bound = predict(rates(train_s=2.0, producer_groups_per_s=8.0, consumer_groups_per_s=8.0))
    assert bound.idle_off == pytest.approx(0.0)
    assert bound.step_s_on == pytest.approx(2.0) and not bound.generate
    # producers on GPUs, consumer generating on transformers at 0.5 groups/s: 6% idle to win,
    # a 0.4% shorter step
    slow = predict(rates(producer_groups_per_s=7.5, consumer_groups_per_s=0.5))
    assert slow.idle_off == pytest.approx(1 - 7.5 / 8)
    assert slow.step_s_on == pytest.approx(8.5 / 8) and not slow.generate


def test_producers_slowed_by_generation_count_against_it():
    alone = predict(rates(consumer_groups_per_s=8.0))
    # on shared cores the producers deliver 0.1 groups/s while the consumer generates
    shared = predict(rates(producer_groups_per_s_on=0.1, consumer_groups_per_s=8.0))
    assert alone.generate and not shared.generate
    assert shared.step_s_on == pytest.approx((8 + 8) / 8.1)


def feed(planner, steps, *, train_s=1.0, step_s=2.0, producer_groups=8, generated=False):
    for _ in range(steps):
        planner.add_step(train_s, step_s, producer_groups, generated)


def test_auto_waits_for_warmup_probes_then_follows_the_model():
    planner = OnlinePlanner("auto", batch_groups=8)
    feed(planner, WARMUP_STEPS)
    assert not planner.generate()  # still warming up (and the first step is start-up)
    feed(planner, 1)
    assert planner.prediction().idle_off == pytest.approx(0.5)
    assert planner.generate()  # idle, own rate unknown: try it
    planner.add_generation(1, 4.0)  # 0.25 groups/s, and the producers slowed to 3.75/s
    feed(planner, 1, producer_groups=7.5, generated=True)
    assert not planner.generate()
    metrics = planner.metrics()
    assert metrics["planned_consumer_idle_off"] == pytest.approx(0.5)
    assert metrics["planned_step_s_on"] > metrics["planned_step_s_off"]


def test_on_and_off_do_not_decide():
    on = OnlinePlanner("on", batch_groups=8)
    off = OnlinePlanner("off", batch_groups=8)
    assert on.generate() and not off.generate()
    feed(off, 3)
    assert not off.generate() and off.metrics()["planned_consumer_idle_off"] == 0.5


def test_config_words_and_refusals():
    cfg = run_config("rollout.consumers_generate=on")
    assert cfg.rollout.consumers_generate == "on"  # YAML's bare on is a boolean
    assert consumer_generation_mode(run_config("rollout.consumers_generate=auto")) == "auto"
    lora = "model.lora={rank: 4, alpha: 8}"
    assert consumer_generation_mode(run_config("rollout.consumers_generate=auto", lora)) == "off"
    with pytest.raises(ConfigError, match=r"consumers_generate=on cannot run here: model\.lora"):
        load_config(None, ["rollout.consumers_generate=on", lora])


# -- generation through the one rollout path ----------------------------------------------------


class CountReward(BaseReward):
    name = "count"

    def score(self, response, example, ctx):
        return RewardResult(reward=float(len(response)), format_acc=1.0, ans_acc=0.0)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return (
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )


def test_consumer_generation_tags_groups_with_its_version_and_behaviour_logprobs(tiny):
    model, tokenizer = tiny
    cfg = run_config(
        "rollout.consumers_generate=on",
        "rollout.consumer_generate_prompts=2",
        "rollout.generation.num_generations=3",
        "rollout.generation.max_new_tokens=5",
        "training.train_batch_size=2",
        "training.train_microbatch_size=6",
        "transport.max_staleness=0",
    )
    buffer = RolloutBuffer(_buffer_settings(cfg))
    buffer.advance_version(3)
    prompts = [
        EncodedPrompt(uid=f"p:{i}", prompt_ids=tokenizer(f"{i} + {i} =")["input_ids"], example={})
        for i in range(5)
    ]
    recorder = SpanRecorder("consumer-0", "consumer")
    gen = build_consumer_generation(
        cfg,
        0,
        model,
        tokenizer,
        prompts,
        CountReward(),
        BufferClient(LocalHandle(buffer)),
        recorder,
    )
    model.train()
    for _ in range(4):  # staleness 0 at version 3: room for (3 + 1) steps of 2 groups
        assert gen.generate(3)
    assert model.training  # the engine's mode is left as it was
    assert not gen.generate(3)  # no room: nothing made, nothing waited for
    status, batch = buffer.take(2, timeout=0, step=3)
    assert status == "batch" and len(batch.groups) == 2
    for group in batch.groups:
        assert group.policy_version == 3 and group.producer == cfg.launch.num_producers
        assert group.uid.endswith("@c0e0") and group.group_size == 3
        for ids, logprobs in zip(group.response_ids, group.behaviour_logprobs, strict=True):
            assert logprobs.shape == ids.shape
            reference = _logprobs(model, group.prompt_ids, ids)
            torch.testing.assert_close(logprobs, reference, atol=1e-4, rtol=1e-4)
        assert group.rewards == [float(len(t)) for t in group.response_texts]
    assert [s["name"] for s in recorder.drain()].count(GENERATE) == 4
    metrics = gen.step_done(1.0, 1.0, batch.groups)
    assert metrics["consumer_generated_groups"] == 8.0
    assert metrics["consumer_trained_groups"] == 2.0
    assert gen.state()["producer"]["sampler"] is not None


def _buffer_settings(cfg):
    from zbrl.assembly.shared_settings import buffer_settings

    return buffer_settings(cfg)


def _logprobs(model, prompt_ids, response_ids):
    ids = torch.tensor([list(prompt_ids) + response_ids.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, response_ids[:, None]).squeeze(1)


# -- the consumer's wait loop -------------------------------------------------------------------


class StubEngine:
    def __init__(self, rank=0, world_size=1, reduce=None):
        self.rank, self.world_size, self.reduce = rank, world_size, reduce

    def full_state_dict(self):
        return {}

    def all_reduce(self, values, op):
        return self.reduce(self.rank, values, op)


class StubTrainer:
    def __init__(self, engine):
        self.engine = engine
        self.trained = []

    def train(self, groups, policy_version=None):
        self.trained.append([g.uid for g in groups])
        return {"loss": 0.0}


class StubPublisher:
    def publish(self, version, weights):
        pass

    def flush(self):
        pass


class ScriptedGeneration:
    """Generates by putting one group of producer ``index`` into ``buffer``; after
    ``arrive_after`` calls, a producer's groups arrive (the step can be taken)."""

    def __init__(self, buffer, *, want=True, arrive_after=2, index=1):
        self.buffer, self.want, self.arrive_after, self.index = buffer, want, arrive_after, index
        self.calls = []

    @property
    def producer_index(self):
        return self.index

    def wants(self):
        return self.want

    def generate(self, version):
        self.calls.append(version)
        if len(self.calls) == self.arrive_after:
            put_groups(self.buffer, producer=0, n=2)
        return True

    def step_done(self, train_s, step_s, groups):
        return {"consumer_trained_groups": float(sum(g.producer != 0 for g in groups))}

    def state(self):
        return {}

    def load_state(self, state):
        pass


def put_groups(buffer, producer, n):
    reservation = buffer.reserve(producer, n, timeout=0)
    buffer.put(
        [
            RolloutGroup(
                uid=f"p{producer}:{t}",
                prompt_ids=[1, 2],
                response_ids=[torch.tensor([3])],
                behaviour_logprobs=[torch.tensor([-1.0])],
                rewards=[1.0],
                format_acc=[1.0],
                ans_acc=[1.0],
                truncated=[False],
                policy_version=0,
                temperature=1.0,
                producer=producer,
                ticket=t,
                response_texts=["x"],
            )
            for t in reservation.tickets
        ]
    )


class TimeoutRecorder(BufferClient):
    def __init__(self, buffer):
        super().__init__(LocalHandle(buffer))
        self.timeouts = []

    def take(self, n, timeout, step=0, rank=0, ranks=1):
        self.timeouts.append(timeout)
        return super().take(n, timeout, step, rank, ranks)


def make_consumer(tmp_path, buffer, engine, generation):
    client = TimeoutRecorder(buffer)
    steps = []
    consumer = Consumer(
        consumer_settings(
            str(tmp_path), groups_per_step=2, max_steps=1, save_final=False, uid_log=None
        ),
        StubTrainer(engine),
        client,
        StubPublisher(),
        SpanRecorder("consumer-0", "consumer"),
        on_step=lambda v, m: steps.append(m),
        generation=generation,
    )
    return consumer, client, steps


def two_group_buffer(num_producers=1):
    cfg = run_config("training.train_batch_size=2", f"launch.num_producers={num_producers}")
    return RolloutBuffer(_buffer_settings(cfg))


def test_an_idle_consumer_generates_until_its_step_can_be_taken(tmp_path, monkeypatch):
    monkeypatch.setattr(consumer_module, "POLL_TIMEOUT_S", 0.01)
    buffer = two_group_buffer()
    generation = ScriptedGeneration(buffer, arrive_after=2)
    consumer, client, steps = make_consumer(tmp_path, buffer, StubEngine(), generation)
    result = consumer.run()
    assert result.steps == 1
    assert generation.calls == [0, 0]  # stopped at the first look after the data came
    assert client.timeouts[:3] == [0.0, 0.0, 0.0]  # looks without waiting while generating
    assert consumer.trainer.trained == [["p0:0", "p0:1"]]
    assert steps[0]["consumer_trained_groups"] == 0.0
    spans = consumer.recorder.drain()
    assert [s["name"] for s in spans].count(WAIT_FOR_DATA) == 3


def test_groups_a_consumer_made_are_trained_and_counted(tmp_path):
    buffer = two_group_buffer()

    class OwnGroups(ScriptedGeneration):
        def generate(self, version):
            self.calls.append(version)
            put_groups(self.buffer, producer=self.index, n=1)
            return True

    generation = OwnGroups(buffer)
    consumer, _, steps = make_consumer(tmp_path, buffer, StubEngine(), generation)
    consumer.run()
    assert consumer.trainer.trained == [["p1:0", "p1:1"]]
    assert generation.calls == [0, 0] and steps[0]["consumer_trained_groups"] == 2.0


def test_a_consumer_that_does_not_want_to_generate_waits(tmp_path, monkeypatch):
    monkeypatch.setattr(consumer_module, "POLL_TIMEOUT_S", 0.01)
    buffer = two_group_buffer()
    generation = ScriptedGeneration(buffer, want=False)
    consumer, client, _ = make_consumer(tmp_path, buffer, StubEngine(), generation)
    threading.Timer(0.05, put_groups, (buffer, 0, 2)).start()
    consumer.run()
    assert generation.calls == [] and set(client.timeouts) == {0.01}


class BarrierReduce:
    """``all_reduce`` of two ranks in threads."""

    def __init__(self, ranks):
        self.barrier = threading.Barrier(ranks)
        self.values = {}
        self.calls = 0

    def __call__(self, rank, values, op):
        assert op == "max"
        self.values[rank] = values
        self.barrier.wait(timeout=10)
        out = [max(v[i] for v in self.values.values()) for i in range(len(values))]
        self.barrier.wait(timeout=10)
        self.calls += rank == 0
        return out


def test_data_parallel_ranks_generate_together_on_rank_zeros_decision(tmp_path, monkeypatch):
    monkeypatch.setattr(consumer_module, "POLL_TIMEOUT_S", 0.01)
    buffer = two_group_buffer()
    reduce = BarrierReduce(2)
    gens = [
        ScriptedGeneration(buffer, want=True, arrive_after=3, index=1),
        ScriptedGeneration(buffer, want=False, arrive_after=99, index=2),  # follows rank 0
    ]
    consumers = [
        make_consumer(tmp_path / str(r), buffer, StubEngine(r, 2, reduce), gens[r])[0]
        for r in range(2)
    ]
    threads = [threading.Thread(target=c.run) for c in consumers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads)
    assert gens[0].calls == [0, 0, 0] and gens[1].calls == [0, 0, 0]
    assert consumers[0].trainer.trained == consumers[1].trainer.trained == [["p0:0", "p0:1"]]
    assert reduce.calls == 4  # three looks with nothing, the fourth finds the batch


def test_a_batch_is_a_trainbatch():  # the scripted groups pass the buffer's own checks
    buffer = two_group_buffer()
    put_groups(buffer, 0, 2)
    status, batch = buffer.take(2, timeout=0)
    assert status == "batch" and isinstance(batch, TrainBatch)
