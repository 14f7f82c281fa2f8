"""Agent episodes (environment.type: agent): a user's async function drives each episode through
the endpoint with an ``openai`` client; the episode runner generates the calls in batches and
trains the tokens the endpoint recorded. Failures are counted and their groups dropped."""

import asyncio
import sys
from dataclasses import replace

import pytest
from episode_stubs import EOS, TOKENIZER, ScriptedBackend, encoded
from role_settings import buffer_settings, sampling_params
from test_buffer import make_group
from test_endpoint import SETTINGS, calc_then_answer

from zbrl.assembly.environments import check_environment
from zbrl.environments.tools import Calculator
from zbrl.errors import RunError
from zbrl.rewards.base import BaseReward, RewardResult
from zbrl.rollout.agents.environment import AgentEnvironment, AgentSettings
from zbrl.rollout.agents.launch import AgentLauncher
from zbrl.rollout.endpoint.conversation import Renderer
from zbrl.rollout.endpoint.server import Endpoint
from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
from zbrl.rollout.transcripts import ChatTranscript
from zbrl.rollout.turns import TurnFormatter
from zbrl.transport.buffer import RolloutBuffer


async def calculator_agent(client, example):
    """Asks the policy; runs its <calc> call and sends the result back; returns the answer."""
    messages = list(example["messages"])
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        text = reply.choices[0].message.content
        if "<calc>" not in text:
            return text
        expression = text.split("<calc>")[1].split("</calc>")[0]
        result = Calculator().call({"expression": expression})
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": result}]
    return text


async def scoring_agent(client, example):
    await client.chat.completions.create(model="policy", messages=example["messages"])
    return 0.25


async def crashing_agent(client, example):
    await client.chat.completions.create(model="policy", messages=example["messages"])
    raise ConnectionError("the agent's own service is down")


async def slow_agent(client, example):
    await asyncio.sleep(30)


async def malformed_agent(client, example):
    await client.chat.completions.create(model="policy", messages=example["messages"])
    return {"reward": 1, "solved": True}


def judging_agent(result):
    async def agent(client, example):
        await client.chat.completions.create(model="policy", messages=example["messages"])
        return result

    return agent


class LastNumber(BaseReward):
    def score(self, response, example, ctx):
        right = response.strip("<answer>/ ") == example["gt_answer"]
        return RewardResult(reward=float(right), format_acc=1.0, ans_acc=float(right))


def agent_runner(
    agent,
    timeout_s=20.0,
    tokenizer=TOKENIZER,
    eos_ids=frozenset({EOS}),
    on_change="segment",
    retries=0,
):
    """A long batching window: a batch closes when every running episode has called."""
    settings = replace(SETTINGS, batch_window_s=10.0)
    endpoint = Endpoint(Renderer(tokenizer, set(eos_ids)), settings, "policy")
    agents = AgentSettings(on_change, timeout_s, retries)
    env = AgentEnvironment(endpoint, AgentLauncher(agent, None), agents)
    formatter = TurnFormatter(tokenizer, "user", eos_ids=set(eos_ids))
    return EpisodeRunner(env, ChatTranscript(formatter), EpisodeLimitSettings(4, 200))


def test_agent_episodes_train_exactly_the_endpoint_tokens():
    backend = ScriptedBackend(calc_then_answer)
    runner = agent_runner(calculator_agent)
    prompts = [encoded("12*34", uid="a", gt="408"), encoded("5*6", uid="b", gt="31")]
    batches = []

    def generate(contexts, params):
        batches.append(len(contexts))
        return backend.generate(contexts, params)

    groups = runner.run(generate, prompts, sampling_params(n=3, max_new_tokens=40), 5)
    assert [len(g) for g in groups] == [3, 3]
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            assert c.failure is None and c.prompt_ids == prompt.prompt_ids
            full = c.prompt_ids + c.token_ids.tolist()
            # every model turn is a generation, given exactly the tokens before it; every
            # trained token lies in a model turn; the rendered turns are the template's text
            # tokenized once
            n = len(c.prompt_ids)
            for turn in c.turns:
                span = full[n + turn["start"] : n + turn["end"]]
                trained = c.loss_mask[turn["start"] : turn["end"]]
                if turn["role"] == "model":
                    assert (full[: n + turn["start"]], span) in backend.generated
                    assert trained.all()
                else:
                    assert TOKENIZER.encode(turn["text"], add_special_tokens=False) == span
                    assert not trained.any()
            assert c.turns[-1]["end"] == len(c.token_ids)
            assert [t["role"] for t in c.turns] == ["model", "env", "model"]
            assert c.counts["turns"] == 2 and c.versions is None
    # the 12 calls of 6 concurrent episodes ran as two backend batches
    assert batches == [6, 6]
    scored = runner.score(LastNumber(), [p.example for p in prompts], groups)
    assert [[r.reward for r in results] for _, results in scored] == [[1.0] * 3, [0.0] * 3]


def test_agent_reward_and_failures_are_counted_and_never_scored():
    backend = ScriptedBackend(calc_then_answer)
    prompt = [encoded("2*3", gt="6")]
    params = sampling_params(n=2, max_new_tokens=40)
    (given,) = agent_runner(scoring_agent).run(backend.generate, prompt, params)
    assert [c.given_reward for c in given] == [0.25, 0.25]
    for agent, failure, timeout_s in [
        (crashing_agent, "agent_crashes", 20.0),
        (malformed_agent, "agent_malformed", 20.0),
        (slow_agent, "agent_timeouts", 0.5),
    ]:
        runner = agent_runner(agent, timeout_s=timeout_s)
        (group,) = runner.run(backend.generate, prompt, params)
        assert all(c.failure.startswith(failure) for c in group), [c.failure for c in group]
        assert all(c.counts[failure] == 1 and c.counts["agent_failures"] == 1 for c in group)
        ((_, results),) = runner.score(LastNumber(), [prompt[0].example], [group])
        assert [r.reward for r in results] == [0.0, 0.0]


def test_buffer_drops_groups_with_failed_episodes():
    buf = RolloutBuffer(buffer_settings(groups_per_step=1, max_staleness=0, num_producers=1))
    res = buf.reserve(0, 10, timeout=0)
    bad = make_group(res.tickets[0], 0)
    bad.episode_failures = 1
    buf.put([bad])
    assert buf.stats.groups_failed_episodes == 1
    assert buf.stats.per_reason == {"failed_episodes": 1}
    assert buf.take(1, timeout=0)[0] != "batch"


PROGRAM = """
import json, sys
import openai
example = json.load(sys.stdin)
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
reply = client.chat.completions.create(model="policy", messages=example["messages"])
print("some log line")
print(json.dumps(reply.choices[0].message.content))
"""


@pytest.mark.slow  # a Python process that imports openai: a few seconds
def test_a_program_runs_an_episode_with_the_openai_environment_variables():
    backend = ScriptedBackend(calc_then_answer)
    endpoint = Endpoint(Renderer(TOKENIZER, {EOS}), SETTINGS, "policy")
    launcher = AgentLauncher(None, [sys.executable, "-c", PROGRAM])
    formatter = TurnFormatter(TOKENIZER, "user", eos_ids={EOS})
    runner = EpisodeRunner(
        AgentEnvironment(endpoint, launcher, AgentSettings("segment", 60.0, 0)),
        ChatTranscript(formatter),
        EpisodeLimitSettings(4, 99),
    )
    (group,) = runner.run(backend.generate, [encoded("2*3")], sampling_params(n=1))
    (c,) = group
    assert c.failure is None and c.text == "<calc>2*3</calc>" and c.given_reward is None
    assert c.token_ids[c.loss_mask].tolist() == backend.generated[0][1]
    crashing = AgentLauncher(None, [sys.executable, "-c", "raise SystemExit(3)"])
    outcome = crashing.launch(endpoint.base_url, "k", {}).result()
    assert outcome.failure == "agent_crashes" and outcome.detail.startswith("exit 3")


async def two_turn_agent(client, example):
    """Sends the model's answer back with a follow-up question, once."""
    messages = list(example["messages"])
    first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "user", "content": "and 1+1?"}]
    second = await client.chat.completions.create(model="policy", messages=messages)
    return second.choices[0].message.content


def test_embedded_model_agent_episodes_are_the_generated_tokens(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    backend = TransformersBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir), TOKENIZER)
    calls = []

    def generate(contexts, params):
        out = backend.generate(contexts, params)
        calls.extend((ctx, c[0].token_ids.tolist()) for ctx, c in zip(contexts, out, strict=True))
        return out

    runner = agent_runner(two_turn_agent)
    prompts = [encoded("12+30", uid="a"), encoded("7+8", uid="b")]
    groups = runner.run(generate, prompts, sampling_params(n=2, max_new_tokens=8))
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            assert c.failure is None and c.prompt_ids == prompt.prompt_ids
            full = c.prompt_ids + c.token_ids.tolist()
            n = len(c.prompt_ids)
            models = [t for t in c.turns if t["role"] == "model"]
            assert len(models) == 2
            for turn in models:  # generated from exactly the tokens before it, kept as generated
                assert (
                    full[: n + turn["start"]],
                    full[n + turn["start"] : n + turn["end"]],
                ) in calls
            trained = sum(t["end"] - t["start"] for t in models)
            assert int(c.loss_mask.sum()) == trained
            assert c.logprobs[c.loss_mask].lt(0).all() and c.logprobs[~c.loss_mask].eq(0).all()


def test_an_agent_says_whether_it_solved_the_episode():
    """Held-out accuracy counts ``ans_acc`` at 1.0: an agent's ``correct`` when it says, else
    whether its reward is positive (partial credit counts as solved then)."""
    backend = ScriptedBackend(calc_then_answer)
    prompt = encoded("2*3", gt="6")
    params = sampling_params(n=1, max_new_tokens=40)
    for result, reward, acc in [
        ({"reward": 0.5, "correct": False}, 0.5, 0.0),
        ({"reward": 0.0, "correct": True}, 0.0, 1.0),
        ({"reward": 0.5}, 0.5, 1.0),
        (0.5, 0.5, 1.0),
        (0.0, 0.0, 0.0),
    ]:
        runner = agent_runner(judging_agent(result))
        (group,) = runner.run(backend.generate, [prompt], params)
        ((_, (r,)),) = runner.score(LastNumber(), [prompt.example], [group])
        assert (r.reward, r.ans_acc, group[0].failure) == (reward, acc, None), result
    for bad in [{"reward": "1"}, {"reward": 1, "correct": 1}, {"correct": True}, [1]]:
        runner = agent_runner(judging_agent(bad))
        ((c,),) = runner.run(backend.generate, [prompt], params)
        assert c.failure.startswith("agent_malformed"), bad


def test_a_call_past_the_limit_ends_the_episode_truncated_and_trained():
    """Past ``max_turns`` the endpoint answers 200 with an empty ``length`` answer: the episode
    ends truncated (as a built-in one does at its limit) and is trained, not failed."""
    backend = ScriptedBackend(calc_then_answer)
    runner = agent_runner(calculator_agent)
    runner.limits = EpisodeLimitSettings(1, 200)
    ((c,),) = runner.run(backend.generate, [encoded("2*3")], sampling_params(n=1))
    assert c.failure is None and c.finish_reason == "length"
    assert c.counts["turn_limit"] == 1 and c.counts["turns"] == 1
    assert c.text == "" and len(backend.generated) == 1


def test_validate_checks_the_agent_program_exists(tmp_path, monkeypatch):
    from zbrl.config import load_config
    from zbrl.rollout.agents.build import check_command

    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunError, match=r"environment\.command: python is given the script 'nope"):
        check_command(["python", "nope.py"])
    with pytest.raises(RunError, match=r"environment\.command: the program 'no-such-agent'"):
        check_command(["no-such-agent", "--fast"])
    (tmp_path / "agent.py").write_text("print(1)\n")
    check_command([sys.executable, "-u", "agent.py"])
    check_command(["python3", "-c", "print(1)"])
    check_command(["true", "nope.py"])  # not an interpreter: its arguments are its own
    cfg = load_config(None, ["environment.type=agent", "environment.command=[python, nope.py]"])
    with pytest.raises(RunError, match=r"nope\.py"):
        check_environment(cfg)
    with pytest.raises(ValueError, match=r"program_lifetime: `run` is for an agent program"):
        load_config(
            None,
            [
                "environment.type=agent",
                "environment.run=zbrl.embedded.calculator_agent:solve",
                "environment.program_lifetime=run",
            ],
        )
