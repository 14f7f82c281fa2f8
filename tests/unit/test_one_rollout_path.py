"""One rollout path: a plain prompt is an episode with no environment turn, run and scored by the
same EpisodeRunner as a multi-turn one, and the producer and the evaluator both go through it."""

import pytest
import torch
from episode_stubs import TOKENIZER, ScriptedBackend, encoded, runner
from role_settings import producer_settings, sampling_params, single_turn

from zbrl.environments.base import EnvTurn
from zbrl.evaluation.evaluator import EvalSet, evaluate_set
from zbrl.rewards.base import BaseReward, RewardResult
from zbrl.rollout.episodes import EpisodeRunner
from zbrl.rollout.producer import Producer
from zbrl.rollout.single_turn import NoEnvironment
from zbrl.telemetry.spans import SpanRecorder


def answer_script(context, sample):
    """Answers the question's product (sample 1 wrongly), at every turn."""
    question = context.split("<|user|>")[1].split("<|end|>")[0]
    a, b = question.split("*")
    return f"<answer>{int(a) * int(b) + sample}</answer>"


class Shaped(BaseReward):
    """Right answer 1.0, plus a term of every field of the reward context but ``eval_mode``: a
    producer and an evaluator scoring the same episode differently give different rewards."""

    name = "shaped"

    def score(self, response, example, ctx):
        ok = response == f"<answer>{example['gt_answer']}</answer>"
        shape = ctx.response_tokens / ctx.max_new_tokens - 0.5 * ctx.truncated
        return RewardResult(reward=float(ok) + shape, format_acc=1.0, ans_acc=float(ok))


class NudgeOnce:
    """Answers the first model turn with "again" (reward 0.25), ends the episode on the second
    (reward 0.5)."""

    def start(self, example):
        return _Nudge()


class _Nudge:
    def __init__(self):
        self.turns = 0

    def step(self, text):
        self.turns += 1
        if self.turns == 1:
            return EnvTurn(message="again", reward=0.25)
        return EnvTurn(message=None, reward=0.5)


class Spy(EpisodeRunner):
    """An EpisodeRunner that records who ran and scored through it."""

    def __init__(self, inner):
        super().__init__(
            inner.environment,
            inner.transcript,
            inner.limits,
            score_final_turn=inner.score_final_turn,
        )
        self.runs = 0
        self.scores = 0

    def run(self, *args, **kw):
        self.runs += 1
        return super().run(*args, **kw)

    def score(self, *args, **kw):
        self.scores += 1
        return super().score(*args, **kw)


PARAMS = sampling_params(n=2, temperature=1.0, max_new_tokens=40)
PROMPTS = [encoded("12*34", uid="q:0", gt="408"), encoded("5*6", uid="q:1", gt="30")]


def through_producer(backend, episodes):
    producer = Producer(
        producer_settings(inference_batch_size=len(PROMPTS), sampling=PARAMS),
        PROMPTS,
        backend,
        Shaped(),
        None,
        None,
        SpanRecorder("producer-0", "producer"),
        episodes,
    )
    return producer._rollout([(p, 0, 1.0) for p in PROMPTS], [0, 1], version=0)


def through_evaluator(backend, episodes):
    _, records = evaluate_set(
        backend, episodes, Shaped(), EvalSet("s", PROMPTS), PARAMS, batch_size=len(PROMPTS)
    )
    return records


def test_a_plain_prompt_is_the_trivial_episode_of_the_one_runner():
    """A single-turn episode is the backend's completion as it is (one call, same tokens,
    log-probs, text and finish), with one model turn and no environment turn; reported as a
    plain completion (its text, no mask, no turns, no events)."""
    direct = ScriptedBackend(answer_script).generate([p.prompt_ids for p in PROMPTS], PARAMS)
    backend = ScriptedBackend(answer_script)
    episodes = single_turn(PARAMS)
    assert isinstance(episodes, EpisodeRunner) and isinstance(episodes.environment, NoEnvironment)
    ran = episodes.run(backend.generate, PROMPTS, PARAMS)
    assert backend.contexts == [p.prompt_ids for p in PROMPTS for _ in range(PARAMS.n)]
    for got, want in zip(ran, direct, strict=True):
        for ep, c in zip(got, want, strict=True):
            assert torch.equal(ep.token_ids, c.token_ids) and torch.equal(ep.logprobs, c.logprobs)
            assert (ep.text, ep.finish_reason, ep.versions) == (c.text, c.finish_reason, None)
            assert [t["role"] for t in ep.turns] == ["model"] and bool(ep.loss_mask.all())
        record = episodes.group_record(got)
        assert record.response_texts == [c.text for c in want]
        assert (record.loss_masks, record.turns, record.env_counts) == (None, None, {})
        assert episodes.sample_record(got[0]) == {}


@pytest.mark.parametrize("multi_turn", [False, True], ids=["plain", "episodes"])
def test_producer_and_evaluator_run_and_score_through_the_same_runner(multi_turn):
    """The same prompts through the producer and the evaluator: both call the one runner, get
    the same episodes and the same rewards (the reward sees the same context: an evaluator with
    scoring of its own — another token budget, no turn rewards — fails this)."""

    def episodes():
        if multi_turn:  # the test's two cases, not a branch of the code under test
            return Spy(runner(ScriptedBackend(answer_script), NudgeOnce(), max_total_tokens=90))
        return Spy(single_turn(PARAMS))

    produced, evaluated = episodes(), episodes()
    groups = through_producer(ScriptedBackend(answer_script), produced)
    records = through_evaluator(ScriptedBackend(answer_script), evaluated)
    assert (produced.runs, produced.scores) == (1, 1)
    assert (evaluated.runs, evaluated.scores) == (1, len(PROMPTS))  # one reward call per prompt
    samples = [(g, j) for g in groups for j in range(g.group_size)]
    assert len(records) == len(samples)
    for (group, j), rec in zip(samples, records, strict=True):
        assert rec["uid"] == group.uid.split("@")[0]
        assert rec["reward"] == group.rewards[j]
        assert rec["ans_valid"] == (group.ans_acc[j] >= 1.0)
        assert rec["length"] == int(group.response_ids[j].numel())
        assert rec["truncated"] == group.truncated[j]
    rewards = [r for g in groups for r in g.rewards]
    if multi_turn:
        assert all(len(e) == 3 for g in groups for e in g.episodes)  # model, env, model
        assert [r["turns"] for r in records] == [e for g in groups for e in g.episodes]
        assert min(rewards) >= 0.75  # both turn rewards are in
        assert [g.ans_acc for g in groups] == [[1.0, 1.0]] * len(PROMPTS)  # turn 2: sample 0
    else:
        assert all(g.episodes is None and g.loss_masks is None for g in groups)
        assert "turns" not in records[0]
        assert [g.ans_acc for g in groups] == [[1.0, 0.0]] * len(PROMPTS)  # sample 1 is wrong


def test_the_runners_first_call_is_the_single_turn_call():
    """Multi-turn or not, the first turn is one call for all prompts with G samples each and
    the run's sampling parameters (the budget capped by the episode's)."""
    calls = []

    def generate(prompt_ids, params):
        calls.append((prompt_ids, params))
        return ScriptedBackend(answer_script).generate(prompt_ids, params)

    single_turn(PARAMS).run(generate, PROMPTS, PARAMS)
    runner(ScriptedBackend(answer_script), NudgeOnce(), max_total_tokens=90).run(
        generate, PROMPTS, PARAMS
    )
    plain, first, *rest = calls
    assert plain == ([p.prompt_ids for p in PROMPTS], PARAMS) == first
    assert [params.n for _, params in rest] == [1]
    assert TOKENIZER.decode(rest[0][0][0]).endswith("again<|end|><|assistant|>")
