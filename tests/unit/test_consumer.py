"""Consumer against a scripted stub buffer and a real Trainer on the embedded tiny model;
Trainer-level checks of the optimizer step (zero advantages, masking, gradient accumulation)."""

import pickle

import pytest
import torch
from role_settings import consumer_settings, step_settings
from transformers import AutoModelForCausalLM, AutoTokenizer

from zbrl.algorithms.policy_loss import LossConfig
from zbrl.telemetry.spans import SpanRecorder
from zbrl.training.consumer import Consumer, ThreadLending
from zbrl.training.engine.single import SingleProcessEngine
from zbrl.training.train_step import Trainer
from zbrl.transport.clients import BufferClient, WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.object_store import ObjectStorePublisher
from zbrl.transport.weight_sync.store import WeightStore
from zbrl.types import RolloutGroup, TrainBatch


class ScriptedBuffer:
    """Plays back ``script`` entries (a TrainBatch or a status string) from ``take``."""

    def __init__(self, script):
        self.script = list(script)
        self.calls = []

    def take(self, n, timeout, step=0, rank=0, ranks=1, node=""):
        self.calls.append(("take", n))
        if not self.script:
            return "end", None
        item = self.script.pop(0)
        return ("batch", item) if isinstance(item, TrainBatch) else (item, None)

    def advance_version(self, version):
        self.calls.append(("advance_version", version))

    def close(self):
        self.calls.append(("close",))

    def state(self):
        self.calls.append(("state",))
        return {"scripted": len(self.script)}

    def called(self, name):
        return [c[1:] for c in self.calls if c[0] == name]


class RecordingStore(WeightStore):
    def __init__(self):
        super().__init__()
        self.versions = []

    def put(self, message):
        self.versions.append(message.version)
        return super().put(message)


def make_group(
    seed,
    *,
    version=0,
    rewards=(1.0, 0.0, 1.0, 0.0),
    lengths=(3, 2, 4, 1),
    truncated=None,
    prompt_len=4,
    temperature=1.0,
):
    gen = torch.Generator().manual_seed(seed)
    g = len(rewards)
    responses = [torch.randint(3, 100, (n,), generator=gen) for n in lengths]
    return RolloutGroup(
        uid=f"t.jsonl:{seed}@e0",
        prompt_ids=torch.randint(3, 100, (prompt_len,), generator=gen).tolist(),
        response_ids=responses,
        behaviour_logprobs=[torch.full((n,), -4.6) for n in lengths],
        rewards=list(rewards),
        format_acc=[1.0] * g,
        ans_acc=[float(r > 0) for r in rewards],
        truncated=list(truncated or [False] * g),
        policy_version=version,
        temperature=temperature,
        producer=0,
        response_texts=[f"resp-{seed}-{j}" for j in range(g)],
    )


def batch(groups, step, partial=False):
    return TrainBatch(
        groups=groups,
        step=step,
        raw_groups=len(groups) + 1,
        raw_metrics={"reward": 0.25, "ans_acc": 0.5},
        partial=partial,
        sample_utilization=0.75,
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def make_trainer(
    model_dir, *, lr=1e-2, optimizer="adamw", microbatch_size=4, microbatch_tokens=None, **settings
):
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    else:
        opt = torch.optim.SGD(policy.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    kw = dict(
        advantage="grpo",
        loss=LossConfig(),
        microbatch_size=microbatch_size,
        microbatch_tokens=microbatch_tokens,
        pad_id=0,
    )
    kw.update(settings)
    return Trainer(SingleProcessEngine(policy, opt, sched), step_settings(**kw))


def params_of(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.fixture
def publishers():
    items = []
    yield items
    for p in items:
        p.close()


def run_consumer(trainer, script, tmp_path, publishers, tokenizer=None, **settings):
    buffer = ScriptedBuffer(script)
    store = RecordingStore()
    publisher = ObjectStorePublisher(WeightStoreClient(LocalHandle(store)))
    publishers.append(publisher)
    steps, rollouts = [], []
    kw = dict(groups_per_step=2, max_steps=None, checkpoint_dir=str(tmp_path / "ckpt"))
    kw.update(settings)
    consumer = Consumer(
        consumer_settings(str(tmp_path), **kw),
        trainer,
        BufferClient(LocalHandle(buffer)),
        publisher,
        SpanRecorder("consumer-0", "consumer"),
        tokenizer=tokenizer,
        on_step=lambda v, m: steps.append((v, m)),
        on_rollouts=lambda v, r: rollouts.append((v, r)),
    )
    return consumer, buffer, store, steps, rollouts


def test_consumer_steps_publish_advance_and_metrics(
    tiny_model_dir, tokenizer, tmp_path, publishers
):
    trainer = make_trainer(tiny_model_dir)
    script = [
        batch([make_group(1, version=0), make_group(2, version=0)], 0),
        "timeout",  # the consumer keeps waiting
        batch([make_group(3, version=0), make_group(4, version=1)], 1),
        batch([make_group(5, version=0, rewards=(1.0, 1.0, 0.0, 0.0))], 2, partial=True),
    ]
    consumer, buffer, store, steps, rollouts = run_consumer(
        trainer,
        script,
        tmp_path,
        publishers,
        tokenizer=tokenizer,
        save_interval=2,
        log_rollout_interval=2,
        rollouts_per_log=1,
    )
    result = consumer.run()

    assert result.steps == 3 and consumer.version == 3
    assert [v for v, _ in steps] == [1, 2, 3]
    assert buffer.called("advance_version") == [(1,), (2,), (3,)]
    assert buffer.called("take") == [(2,)] * 5  # 3 batches, one timeout, then "end"
    assert buffer.calls[-1] == ("close",)
    assert trainer.optimizer_steps == 3
    # weights: announced versions only go up and end at the last step
    assert store.latest_version() == 3
    assert store.versions == sorted(set(store.versions)) and store.versions[-1] == 3
    assert (result.groups_trained, result.samples_trained) == (5, 20)
    assert result.partial_batches == 1

    m1, m2, m3 = (m for _, m in steps)
    # staleness = version trained at - version generated with, per group
    assert (m1["staleness_mean"], m1["staleness_max"]) == (0.0, 0.0)
    assert (m2["staleness_mean"], m2["staleness_max"]) == (0.5, 1.0)  # behind: [1, 0]
    assert (m3["staleness_mean"], m3["staleness_max"]) == (2.0, 2.0)
    assert [m["partial_batch"] for m in (m1, m2, m3)] == [0.0, 0.0, 1.0]
    assert [m["groups"] for m in (m1, m2, m3)] == [2.0, 2.0, 1.0]
    assert m1["raw_groups"] == 3.0 and m1["reward"] == 0.25  # buffer's pre-filter metrics
    assert m1["train_reward"] == pytest.approx(0.5) and m1["train_ans_acc"] == pytest.approx(0.5)
    assert m1["sample_utilization"] == 0.75
    assert m1["trained_tokens"] == 2 * (3 + 2 + 4 + 1)
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in (m1, m2, m3))

    # save_interval=2: step-2 plus the final step-3, both loadable
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-2", "step-3"]
    assert result.final_checkpoint == str(ckpt / "step-3")
    final = AutoModelForCausalLM.from_pretrained(result.final_checkpoint)
    mid = AutoModelForCausalLM.from_pretrained(ckpt / "step-2")
    key = "model.embed_tokens.weight"
    assert torch.equal(final.state_dict()[key], trainer.engine.policy.state_dict()[key])
    assert torch.equal(final.state_dict()[key], store.latest().payload[key])
    assert not torch.equal(mid.state_dict()[key], final.state_dict()[key])
    assert AutoTokenizer.from_pretrained(ckpt / "step-2").pad_token_id == tokenizer.pad_token_id

    # rollout records every 2 steps: only step 2, one group, decoded
    assert [v for v, _ in rollouts] == [2]
    (record,) = rollouts[0][1]
    group3 = script[2].groups[0]
    assert record["step"] == 2 and record["uid"] == group3.uid
    assert record["policy_version"] == 0
    assert record["prompt"] == tokenizer.decode(group3.prompt_ids, skip_special_tokens=False)
    assert record["responses"] == [f"resp-3-{j}" for j in range(4)]
    assert record["rewards"] == [1.0, 0.0, 1.0, 0.0]
    assert record["version_changes"] == [[[0, 0]]] * 4  # one version per response


def test_a_step_borrows_parked_producers_threads_and_gives_them_back(tiny_model_dir, tmp_path):
    assert ThreadLending(own=1, per_producer=1, cap=2).for_step(3) == 2  # capped at the cores
    assert ThreadLending(own=2, per_producer=2, cap=8).for_step(1) == 4
    assert ThreadLending(own=2, per_producer=2, cap=1).for_step(0) == 2  # never below its own

    class Recording(ScriptedBuffer):
        def advance_version(self, version):
            super().advance_version(version)
            self.calls.append(("threads_at_advance", torch.get_num_threads()))

    lent, alone = batch([make_group(1), make_group(2)], 0), batch([make_group(3)], 1)
    lent.parked_producers = 1
    buffer = Recording([lent, alone])
    spans = SpanRecorder("consumer-0", "consumer")
    steps = []
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Consumer(
            consumer_settings(str(tmp_path), groups_per_step=2, max_steps=None),
            make_trainer(tiny_model_dir),
            BufferClient(LocalHandle(buffer)),
            ObjectStorePublisher(WeightStoreClient(LocalHandle(RecordingStore()))),
            spans,
            on_step=lambda v, m: steps.append(m),
            lending=ThreadLending(own=1, per_producer=1, cap=2),
        ).run()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    trained = [s["attrs"]["threads"] for s in spans.drain() if s["name"] == "train_step"]
    assert trained == [2, 1]
    assert [m["lent_threads"] for m in steps] == [1.0, 0.0]
    assert buffer.called("threads_at_advance") == [(1,), (1,)]  # given back before producers run


def test_consumer_stops_at_max_steps(tiny_model_dir, tmp_path, publishers):
    trainer = make_trainer(tiny_model_dir)
    script = [batch([make_group(i)], i) for i in range(3)]
    consumer, buffer, store, _, _ = run_consumer(
        trainer, script, tmp_path, publishers, max_steps=2, save_final=False
    )
    result = consumer.run()
    assert result.steps == 2 and result.final_checkpoint is None
    assert len(buffer.script) == 1  # the third batch was never taken
    assert buffer.called("advance_version") == [(1,), (2,)]
    assert buffer.calls[-1] == ("close",)
    assert store.latest_version() == 2
    assert not (tmp_path / "ckpt").exists()


def test_consumer_closes_buffer_when_training_raises(tiny_model_dir, tmp_path, publishers):
    trainer = make_trainer(tiny_model_dir)
    broken = make_group(9)
    broken.rewards = [1.0, 0.0]  # 2 rewards for 4 completions: ragged reward matrix
    script = [batch([make_group(1)], 0), batch([make_group(2), broken], 1)]
    consumer, buffer, _, steps, _ = run_consumer(trainer, script, tmp_path, publishers)
    with pytest.raises(ValueError, match="length 4"):
        consumer.run()
    assert buffer.calls[-1] == ("close",)
    assert buffer.called("advance_version") == [(1,)]
    assert [v for v, _ in steps] == [1]
    assert consumer.version == 1
    assert not (tmp_path / "ckpt").exists()  # no final checkpoint after a failure


def test_identical_rewards_give_no_update(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir)
    before = params_of(trainer.engine.policy)
    groups = [make_group(1, rewards=(1.0,) * 4), make_group(2, rewards=(0.0,) * 4)]
    metrics = trainer.train(groups)
    assert metrics["advantage_abs_mean"] == 0.0
    assert metrics["grad_norm"] == 0.0
    after = params_of(trainer.engine.policy)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert trainer.optimizer_steps == 1


def test_nontrivial_batch_changes_parameters(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir)
    before = params_of(trainer.engine.policy)
    metrics = trainer.train([make_group(1), make_group(2, rewards=(0.0, 1.0, 0.5, 0.0))])
    assert metrics["grad_norm"] > 0
    assert metrics["advantage_abs_mean"] > 0
    after = params_of(trainer.engine.policy)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "model.embed_tokens.weight" in changed
    assert len(changed) == len(before)


def test_filter_truncated_excludes_truncated_tokens(tiny_model_dir):
    groups = [
        make_group(1, lengths=(3, 2, 4, 1), truncated=[False, True, False, True]),
        make_group(2, lengths=(5, 2, 2, 3), truncated=[True, False, False, False]),
    ]
    kept = make_trainer(tiny_model_dir, filter_truncated=False).train(groups)
    assert kept["trained_tokens"] == 10 + 12
    assert kept["num_tokens"] == 22
    masked = make_trainer(tiny_model_dir, filter_truncated=True).train(groups)
    assert masked["trained_tokens"] == (3 + 4) + (2 + 2 + 3)
    assert masked["num_tokens"] == 14


def test_loss_filter_range_masks_groups_in_trainer(tiny_model_dir):
    groups = [make_group(1), make_group(2, rewards=(1.0,) * 4)]  # acc 0.5 and 1.0
    metrics = make_trainer(tiny_model_dir, loss_filter_range=(0.01, 0.99)).train(groups)
    assert metrics["trained_tokens"] == 10


def test_gradient_accumulation_matches_one_micro_batch(tiny_model_dir):
    groups = [
        make_group(1, lengths=(3, 6, 1, 2), prompt_len=3),
        make_group(2, rewards=(0.0, 1.0, 0.0, 0.0), lengths=(2, 2, 7, 4), prompt_len=6),
    ]
    models = []
    # one pass; 3 rows at a time; length-sorted passes under a 20-token budget (widths 13, 10,
    # 8, 5, 4 after sorting: passes of 1 row (13), 2 rows (10+8), 4 rows (5, 5, 4, 4))
    for size, tokens in ((8, None), (3, None), (8, 20)):
        trainer = make_trainer(
            tiny_model_dir, optimizer="sgd", lr=1.0, microbatch_size=size, microbatch_tokens=tokens
        )
        before = params_of(trainer.engine.policy)
        trainer.train(groups)
        after = params_of(trainer.engine.policy)
        models.append({k: after[k] - before[k] for k in before})
    ref = models[0]
    assert ref["model.embed_tokens.weight"].abs().sum() > 0
    for other in models[1:]:
        for k in ref:
            torch.testing.assert_close(other[k], ref[k], atol=1e-5, rtol=1e-4)


def test_minibatch_groups_take_several_optimizer_steps(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir, minibatch_groups=1)
    trainer.train([make_group(1), make_group(2), make_group(3)])
    assert trainer.optimizer_steps == 3


def test_beta_without_reference_is_rejected(tiny_model_dir):
    with pytest.raises(ValueError, match="reference model"):
        make_trainer(tiny_model_dir, loss=LossConfig(beta=0.1))


def with_true_logprobs(model, group, temperature):
    """Set the group's behaviour log-probs to the model's own, at ``temperature``."""
    for j, response in enumerate(group.response_ids):
        ids = torch.tensor([group.prompt_ids + response.tolist()])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        p = len(group.prompt_ids)
        steps = torch.log_softmax(logits[p - 1 : p - 1 + response.numel()] / temperature, -1)
        group.behaviour_logprobs[j] = steps.gather(1, response.view(-1, 1)).squeeze(1)
    return group


def test_each_row_is_scored_at_its_own_sampling_temperature(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir, microbatch_size=8)
    policy = trainer.engine.policy
    hot = with_true_logprobs(policy, make_group(1, temperature=1.0), 1.0)
    cold = with_true_logprobs(policy, make_group(2, temperature=0.7, prompt_len=6), 0.7)
    metrics = trainer.train([hot, cold])  # one micro-batch mixing two temperatures
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)

    trainer = make_trainer(tiny_model_dir, microbatch_size=8)
    wrong = with_true_logprobs(
        trainer.engine.policy, make_group(2, temperature=0.7, prompt_len=6), 1.0
    )
    hot = with_true_logprobs(trainer.engine.policy, make_group(1, temperature=1.0), 1.0)
    metrics = trainer.train([hot, wrong])
    assert abs(metrics["ratio_mean"] - 1.0) > 1e-3


def test_fully_masked_step_is_finite_and_changes_nothing(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir, filter_truncated=True)
    before = params_of(trainer.engine.policy)
    metrics = trainer.train(
        [make_group(1, truncated=[True] * 4), make_group(2, truncated=[True] * 4)]
    )
    assert metrics["trained_tokens"] == 0.0
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    after = params_of(trainer.engine.policy)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_engine_state_round_trip_gives_identical_next_step(tiny_model_dir):
    def trainer_with_decay():
        torch.manual_seed(0)
        policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-2, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
        return Trainer(SingleProcessEngine(policy, opt, sched), step_settings(microbatch_size=4))

    first = [make_group(1), make_group(2, rewards=(0.0, 1.0, 0.5, 0.0))]
    second = [make_group(3), make_group(4, rewards=(1.0, 0.0, 0.0, 0.0))]
    original = trainer_with_decay()
    original.train(first)
    state = pickle.loads(pickle.dumps(original.engine.state_dict()))
    assert state["optimizer_steps"] == 1

    resumed, control = trainer_with_decay(), trainer_with_decay()
    resumed.engine.load_state_dict(state)
    assert resumed.optimizer_steps == 1
    assert resumed.engine.current_lr() == original.engine.current_lr() == 5e-3
    assert params_of(resumed.engine.policy).keys() == params_of(original.engine.policy).keys()
    expected = original.train(second)
    got = resumed.train(second)
    assert got["lr"] == expected["lr"] == 5e-3 and got["loss"] == expected["loss"]
    after, resumed_after = params_of(original.engine.policy), params_of(resumed.engine.policy)
    assert all(torch.equal(after[k], resumed_after[k]) for k in after)
    # the state is a snapshot (later steps did not change it), and it matters: without it the
    # same step gives other parameters
    key = "model.embed_tokens.weight"
    assert not torch.equal(state["policy"][key], after[key])
    control.train(second)
    assert not torch.equal(params_of(control.engine.policy)[key], after[key])


def test_consumer_state_round_trip_continues_exactly(tiny_model_dir, tmp_path, publishers):
    def consumer_for(trainer, script, name, on_step):
        publisher = ObjectStorePublisher(WeightStoreClient(LocalHandle(WeightStore())))
        publishers.append(publisher)
        buffer = ScriptedBuffer(script)
        settings = consumer_settings(str(tmp_path / name), groups_per_step=2, save_final=False)
        consumer = Consumer(
            settings,
            trainer,
            BufferClient(LocalHandle(buffer)),
            publisher,
            SpanRecorder("consumer-0", "consumer"),
            on_step=on_step,
        )
        return consumer, buffer

    def second_batch():
        return batch([make_group(3, version=1), make_group(4, version=0)], 1, partial=True)

    states, steps = [], []

    def on_step(version, metrics):
        steps.append((version, metrics))
        if version == 1:  # the policy goes in HF format, the rest in the state
            original.trainer.engine.save_pretrained(tmp_path / "weights-1")
            states.append(pickle.loads(pickle.dumps(original.state())))

    original, _ = consumer_for(
        make_trainer(tiny_model_dir),
        [batch([make_group(1), make_group(2)], 0), second_batch()],
        "original",
        on_step,
    )
    original.run()
    (state,) = states
    assert "policy" not in state["engine"]
    assert {k: state[k] for k in ("version", "groups_trained", "samples_trained")} == {
        "version": 1,
        "groups_trained": 2,
        "samples_trained": 8,
    }

    resumed_steps = []
    resumed, buffer = consumer_for(
        make_trainer(tmp_path / "weights-1"),
        [second_batch()],
        "resumed",
        lambda v, m: resumed_steps.append((v, m)),
    )
    resumed.load_state(state)
    result = resumed.run()
    assert result.steps == 2 and buffer.called("advance_version") == [(2,)]
    assert (result.groups_trained, result.samples_trained, result.partial_batches) == (4, 16, 1)
    assert resumed.trainer.optimizer_steps == original.trainer.optimizer_steps == 2
    (version, metrics), (_, expected) = resumed_steps[0], steps[1]
    assert version == 2
    assert metrics["loss"] == expected["loss"] and metrics["staleness_max"] == 1.0
    after = params_of(original.trainer.engine.policy)
    resumed_after = params_of(resumed.trainer.engine.policy)
    assert all(torch.equal(after[k], resumed_after[k]) for k in after)
