"""On-policy distillation: the per-token advantages against a readable loop reference, the
trainer's use of them, the teacher's scoring and failure path, and the config's refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from zbrl.algorithms.distill import distill_advantages, reverse_kl_per_token
from zbrl.rollout.teacher import TransformersTeacher

AGENT_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo_agent.yaml"


def reference_advantages(advantage, behaviour, teacher, mask, coef, reward_coef):
    out = []
    for t in range(len(behaviour)):
        if mask is not None and not mask[t]:
            out.append(0.0)
        else:
            out.append(reward_coef * advantage + coef * (teacher[t] - behaviour[t]))
    return out


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(("coef", "reward_coef"), [(1.0, 0.0), (0.5, 2.0)])
def test_advantages_match_the_loop_reference(masked, coef, reward_coef):
    gen = torch.Generator().manual_seed(0)
    for length in (1, 5, 17):
        behaviour = -torch.rand(length, generator=gen) * 3
        teacher = -torch.rand(length, generator=gen) * 3
        mask = torch.rand(length, generator=gen) > 0.4 if masked else None
        advantage = float(torch.randn(1, generator=gen))
        got = distill_advantages(
            advantage, behaviour, teacher, mask, coef=coef, reward_coef=reward_coef
        )
        want = reference_advantages(
            advantage,
            behaviour.tolist(),
            teacher.tolist(),
            None if mask is None else mask.tolist(),
            coef,
            reward_coef,
        )
        assert got.tolist() == pytest.approx(want, abs=1e-6)
        kl, n = reverse_kl_per_token(behaviour, teacher, mask)
        keep = [t for t in range(length) if mask is None or mask[t]]
        assert n == len(keep)
        assert kl == pytest.approx(sum(float(behaviour[t] - teacher[t]) for t in keep), abs=1e-5)


def test_advantages_refuse_mismatched_lengths():
    with pytest.raises(ValueError, match="same response tokens"):
        distill_advantages(0.0, torch.zeros(3), torch.zeros(4), None, coef=1.0, reward_coef=0.0)


class ToyLM(torch.nn.Module):
    """Logits depend on the current token only: row ``ids[t]`` of a fixed table."""

    def __init__(self, vocab=11):
        super().__init__()
        self.table = torch.nn.Parameter(
            torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1))
        )
        self.calls = 0
        self.fail_on = set()

    def forward(self, input_ids, attention_mask):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("teacher down")
        return type("Out", (), {"logits": self.table[input_ids]})()


def loop_teacher_logprobs(table, prompt, response):
    seq = prompt + response
    out = []
    for t in range(len(prompt), len(seq)):
        logp = torch.log_softmax(table[seq[t - 1]], dim=-1)
        out.append(float(logp[seq[t]]))
    return out


def test_teacher_scores_each_response_token_in_counted_batches():
    model = ToyLM()
    teacher = TransformersTeacher(model, device=torch.device("cpu"), batch_size=2, pad_id=0)
    seqs = [
        ([1, 2], torch.tensor([3, 4, 5])),
        ([6], torch.tensor([7])),
        ([8, 9, 10], torch.tensor([1, 2])),
    ]
    got = teacher.score(seqs)
    for (prompt, response), logp in zip(seqs, got, strict=True):
        want = loop_teacher_logprobs(model.table.detach(), prompt, response.tolist())
        assert logp.tolist() == pytest.approx(want, abs=1e-5)
    assert (teacher.counts.calls, teacher.counts.sequences, teacher.counts.tokens) == (2, 3, 6)
    assert teacher.counts.failed_calls == 0


def test_a_failed_teacher_call_fails_only_its_sequences():
    model = ToyLM()
    model.fail_on = {1}  # the first call: the two longest sequences (scored longest first)
    teacher = TransformersTeacher(model, device=torch.device("cpu"), batch_size=2, pad_id=0)
    seqs = [
        ([1, 2], torch.tensor([3, 4, 5])),
        ([6], torch.tensor([7])),
        ([8, 9, 10], torch.tensor([1, 2])),
    ]
    got = teacher.score(seqs)
    assert got[0] is None and got[2] is None and got[1] is not None
    assert teacher.counts.failed_calls == 1 and teacher.counts.sequences == 1


# -- the producer, the buffer and the trainer ---------------------------------------------------


@pytest.fixture
def rig(monkeypatch):
    from test_producer import Rig

    from zbrl.rollout import producer as producer_module

    monkeypatch.setattr(producer_module, "POLL_TIMEOUT_S", 0.05)
    rig = Rig(num_prompts=4, groups_per_step=4)
    yield rig
    rig.close()


class StubTeacher:
    """Scores token ``x`` of a response with ``-x / 1000``; fails calls whose sequences hold a
    prompt starting with a token in ``fail_prompts``."""

    def __init__(self, fail_prompts=()):
        from zbrl.rollout.teacher import TeacherCounts

        self.counts = TeacherCounts()
        self.fail_prompts = set(fail_prompts)
        self.seen = []

    def score(self, sequences):
        self.counts.calls += 1
        self.seen.append([(list(p), r.tolist()) for p, r in sequences])
        return [None if p[0] in self.fail_prompts else -r.float() / 1000 for p, r in sequences]


def test_the_producer_attaches_teacher_logprobs_and_a_failed_call_drops_its_group(rig):
    from test_producer import BASE, G

    producer, _, _ = rig.producer(inference_batch_size=4, inference_microbatch_size=4)
    producer.teacher = StubTeacher(fail_prompts={BASE + 2})
    result = producer.run()
    assert result.teacher is producer.teacher.counts
    assert producer.teacher.counts.calls == 1  # the whole chunk in one batched call
    assert len(producer.teacher.seen[0]) == 4 * G
    groups, _ = rig.take_all(4)
    assert sorted(g.prompt_ids[0] - BASE for g in groups) == [0, 1, 3]  # prompt 2 dropped
    for group in groups:
        assert group.teacher_failed == 0
        for ids, logp in zip(group.response_ids, group.teacher_logprobs, strict=True):
            assert torch.equal(logp, -ids.float() / 1000)
    stats = rig.buffer.stats
    assert stats.per_reason == {"teacher_failed": 1}
    assert (stats.groups_dropped_teacher_failed, stats.responses_teacher_failed) == (1, G)


def with_teacher(group, shift):
    group.teacher_logprobs = [lp + shift for lp in group.behaviour_logprobs]
    return group


def test_the_trainer_trains_on_the_distillation_advantages(tiny_model_dir):
    from test_train_step_offpolicy import groups, trainer_for

    from zbrl.training.rows import build_rows
    from zbrl.training.train_step import distill_rows

    overrides = ("algorithm.distill.teacher=embedded", "algorithm.distill.coef=0.5")
    # the teacher agrees with the behaviour policy and no reward is mixed in: nothing to learn
    trainer = trainer_for(tiny_model_dir, *overrides)
    before = {k: v.clone() for k, v in trainer.engine.policy.state_dict().items()}
    trainer.train([with_teacher(g, 0.0) for g in groups()], policy_version=0)
    after = trainer.engine.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # a teacher that disagrees moves the policy, and the step reports the reverse KL
    trainer = trainer_for(tiny_model_dir, *overrides)
    batch = [with_teacher(g, -0.3) for g in groups()]
    metrics = trainer.train(batch, policy_version=0)
    assert metrics["distill/reverse_kl"] == pytest.approx(0.3, abs=1e-5)
    after = trainer.engine.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # each row's advantages: reward_coef * A + coef * (teacher - behaviour), per token
    advantages = torch.tensor([[0.5, -0.5, 0.25, 0.0]])
    rows = build_rows(
        batch[:1], advantages, filter_truncated=False, loss_filter_range=None, trained_version=0
    )
    from zbrl.algorithms.distill import DistillWeights

    distill_rows(rows, DistillWeights(coef=0.5, reward_coef=2.0))
    for row, a in zip(rows, (0.5, -0.5, 0.25, 0.0), strict=True):
        assert row.token_advantages.tolist() == pytest.approx(
            [2.0 * a + 0.5 * -0.3] * row.response_ids.numel(), abs=1e-6
        )


def test_the_trainer_refuses_groups_without_teacher_logprobs(tiny_model_dir):
    from test_train_step_offpolicy import groups, trainer_for

    trainer = trainer_for(tiny_model_dir, "algorithm.distill.teacher=embedded")
    with pytest.raises(ValueError, match="without teacher log-probs"):
        trainer.train(groups(), policy_version=0)


# -- config and pre-flight -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.distill.teacher=embedded", "model.path=/some/model"],
            "only the embedded student",
        ),
        (["algorithm.distill.teacher=embedded", "algorithm.preset=ppo"], "both set per-token"),
        (["algorithm.distill.teacher=http://127.0.0.1:8000/v1"], "behind an endpoint"),
    ],
)
def test_config_refuses_what_cannot_distil(overrides, message):
    from zbrl.config import load_config

    with pytest.raises(Exception, match=message):
        load_config(None, overrides)


def test_an_agent_whose_history_may_split_into_segments_is_refused():
    """The teacher scores an episode's first segment only, so distillation asks agents to keep
    one history (on_history_change=refuse) and is refused with segments."""
    from zbrl.config import load_config

    agent = ["algorithm.distill.teacher=embedded"]
    with pytest.raises(Exception, match="first segment only"):
        load_config(AGENT_RECIPE, agent)
    cfg = load_config(AGENT_RECIPE, [*agent, "environment.on_history_change=refuse"])
    assert cfg.environment.on_history_change == "refuse"


def test_a_teacher_with_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from zbrl.assembly.teacher import check_same_tokenizer
    from zbrl.errors import RunError

    check_same_tokenizer(tiny_model_dir, tiny_model_dir)  # the same: accepted
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_tokens(["<zz_new_token>"])
    other = tmp_path / "other"
    tokenizer.save_pretrained(other)
    with pytest.raises(RunError, match=r"algorithm\.distill\.teacher: the teacher's tokenizer"):
        check_same_tokenizer(other, tiny_model_dir)


def test_teacher_logprobs_survive_the_wire():
    import pickle

    from test_consumer import make_group

    group = with_teacher(make_group(0), -0.25)
    back = pickle.loads(pickle.dumps(group))
    for a, b in zip(group.teacher_logprobs, back.teacher_logprobs, strict=True):
        assert torch.equal(a, b)
    assert math.isclose(float(back.teacher_logprobs[0][0]), -4.6 - 0.25, rel_tol=1e-6)
