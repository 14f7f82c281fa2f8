"""LLM-as-judge: verdict parsing, template checks, failure and deadline paths, and the embedded
tiny model as a judge through the transformers backend."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest

from zbrl.rewards.base import RewardContext
from zbrl.rewards.llm_judge import JudgeReward, check_template, verdict_parser

CTX = RewardContext(response_tokens=3, max_new_tokens=8)
EXAMPLE = {"messages": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "What is 2+3?"}], "gt_answer": "5"}  # fmt: skip


def test_last_number_parser():
    parse = verdict_parser("last_number")
    assert parse("The answer is wrong. Score: 0.25") == 0.25
    assert parse("I give it 1") == 1.0
    assert parse("score 7 out of 10") is None  # the last number, 10, is outside [0, 1]
    assert parse("no verdict here") is None


def test_regex_parser():
    parse = verdict_parser(r"VERDICT:\s*([0-9.]+)")
    assert parse("VERDICT: 0.5 ... VERDICT: 0.75") == 0.75
    assert parse("verdict 0.5") is None
    assert parse("VERDICT: 1.5") is None
    assert verdict_parser(r"[01]\.\d")("yes 0.9") == 0.9  # no group: the whole match
    with pytest.raises(ValueError, match="not a regular expression"):
        verdict_parser("(unclosed")


def test_template_placeholders_are_checked():
    check_template("Q: {prompt} A: {response} ref: {answer} {{literal}}")
    with pytest.raises(ValueError, match=r"\{prompt\}, \{response\} and \{answer\}"):
        check_template("Q: {question}")


@dataclass
class Reply:
    text: str


class ScriptedBackend:
    """Answers each judge prompt with the next scripted reply."""

    def __init__(self, replies, delay_s=0.0, error=None):
        self.replies, self.delay_s, self.error, self.prompts = list(replies), delay_s, error, []

    def generate(self, prompts, params):
        time.sleep(self.delay_s)
        if self.error:
            raise self.error
        self.prompts += prompts
        return [[Reply(self.replies.pop(0))] for _ in prompts]


class Tokenizer:
    def apply_chat_template(self, messages, **kwargs):
        return [ord(c) for c in messages[0]["content"]]


def _judge(backend, **kwargs):
    return JudgeReward(backend, Tokenizer(), sampling=None,
                       template="Q={prompt} R={response} A={answer}", **kwargs)  # fmt: skip


def test_verdicts_become_rewards_and_unparsed_replies_are_counted():
    backend = ScriptedBackend(["score 0.8", "1", "I cannot say"])
    judge = _judge(backend, batch_size=2)
    results = judge.score_batch(["5", "4", "?"], [EXAMPLE] * 3, [CTX] * 3)
    assert [r.reward for r in results[:2]] == [0.8, 1.0] and math.isnan(results[2].reward)
    assert [r.failed for r in results] == [False, False, True]  # no verdict: no score
    assert judge.parse_failures == 1 and judge.failures == 0
    assert "".join(map(chr, backend.prompts[0])) == "Q=What is 2+3? R=5 A=5"


def test_a_failing_or_late_judge_gives_no_score():
    broken = _judge(ScriptedBackend([], error=RuntimeError("CUDA OOM")))
    (r,) = broken.score_batch(["5"], [EXAMPLE], [CTX])
    assert r.failed and math.isnan(r.reward) and broken.failures == 1
    late = _judge(ScriptedBackend(["1"], delay_s=0.5), timeout_s=0.05)
    start = time.monotonic()
    (r,) = late.score_batch(["5"], [EXAMPLE], [CTX])
    assert time.monotonic() - start < 0.4 and r.failed and late.failures == 1


def test_embedded_tiny_model_as_judge(tiny_model_dir):
    """The untrained tiny model is a real backend that gives no verdict: no response gets a
    score, the failures are counted, and nothing raises."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zbrl.rollout.backends.base import SamplingParams
    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = TransformersBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
    params = SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=-1, max_new_tokens=6,
                            stop_strings=())  # fmt: skip
    judge = JudgeReward(backend, tokenizer, params, template="{prompt} {response}",
                        parser=r"VERDICT=([01])")  # fmt: skip
    results = judge.score_batch(["5", "6"], [EXAMPLE] * 2, [CTX] * 2)
    assert all(r.failed for r in results)
    assert judge.parse_failures == 2
    assert all(isinstance(r.metadata["judge_reply"], str) for r in results)


def test_judge_from_the_config(tiny_model_dir):
    from zbrl.assembly.rewards import build_eval_reward_fn, build_reward_fn, check_reward
    from zbrl.config import ConfigError, RunConfig

    cfg = RunConfig.model_validate(
        {"reward": {"type": "llm_judge", "path": str(tiny_model_dir), "max_new_tokens": 4,
                    "verifier": "think_answer_tags"}}
    )  # fmt: skip
    check_reward(cfg)
    judge = build_reward_fn(cfg)
    assert isinstance(judge, JudgeReward) and judge.sampling.temperature == 0.0
    (r,) = judge.score_batch(["<think></think><answer>5</answer>"], [EXAMPLE], [CTX])
    assert r.failed and r.ans_acc == 1.0  # no verdict; accuracy from the verifier
    assert build_eval_reward_fn(cfg).name == "think_answer_tags"
    bad = cfg.model_copy(update={"reward": cfg.reward.model_copy(update={"template": "{q}"})})
    with pytest.raises(ConfigError, match=r"reward: llm_judge template"):
        check_reward(bad)
