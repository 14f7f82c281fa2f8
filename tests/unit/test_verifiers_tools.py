"""``environment.type: verifiers`` with tools: the taskset of vf_calc.py serves a calculator as a
verifiers Toolset (an MCP server); zbrl's ChatHarness sends its tools with every request, runs
the model's tool calls (Hermes blocks the endpoint returns as OpenAI ``tool_calls``) and answers
with ``tool`` messages, re-sending the conversation token-exact, until the model answers. The
trained tokens are the generated ones; tool failures are counted, never fatal to the episode.

Slow tier: verifiers starts the tool server as a process of its own (imports verifiers, mcp and
uvicorn: several seconds)."""

import json
from dataclasses import replace

import pytest
from episode_stubs import EOS, ScriptedBackend, encoded
from role_settings import sampling_params
from test_endpoint import SETTINGS

from zbrl.config.environments import VerifiersEnvironment
from zbrl.embedded.tokenizer import CHAT_TEMPLATE, build_tokenizer
from zbrl.rollout.agents.build import build_agent
from zbrl.rollout.agents.environment import AgentEnvironment, AgentSettings
from zbrl.rollout.agents.launch import AgentLauncher
from zbrl.rollout.endpoint.conversation import Renderer
from zbrl.rollout.endpoint.server import Endpoint
from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
from zbrl.rollout.transcripts import ChatTranscript
from zbrl.rollout.turns import TurnFormatter

pytest.importorskip("verifiers")
pytestmark = pytest.mark.slow

TOOL_TEMPLATE = CHAT_TEMPLATE.replace(
    "{% for message in messages %}",
    "{% for message in messages %}{% if message['role'] == 'tool' %}"
    "{% set message = {'role': 'user', 'content': message['content']} %}{% endif %}",
)
"""The embedded template with tool results rendered as user turns (its roles are system, user
and assistant); the tools themselves are not rendered."""


def tool_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def call(name, arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def calculator_script(context, sample):
    """Adds with the calculator, then answers with its result; on a question whose first operand
    is 7, first divides by zero (a tool error), calls a tool that does not exist and waits past
    the tool deadline."""
    turns = context.split("<|user|>")
    a, b = (int(x) for x in turns[1].split("What is ")[1].split("?")[0].split("+"))
    results = [t.split("<|end|>")[0] for t in turns[2:]]
    plan = [call("add", {"a": a, "b": b})]
    if a == 7:
        plan = [
            call("divide", {"a": a, "b": 0}),
            call("multiply", {"a": a, "b": b}),
            call("wait", {"seconds": 60}),
            *plan,
        ]
    if len(results) < len(plan):
        return plan[len(results)]
    return f"<answer>{results[-1]}</answer>"


def tools_runner(tokenizer):
    agent = build_agent(VerifiersEnvironment(taskset="vf_calc", limits={"tool_timeout_s": 1.0}))
    endpoint = Endpoint(Renderer(tokenizer, {EOS}), replace(SETTINGS, batch_window_s=10.0), "p")
    env = AgentEnvironment(endpoint, AgentLauncher(agent, None), AgentSettings("refuse", 120.0, 0))
    formatter = TurnFormatter(tokenizer, "user", eos_ids={EOS})
    return EpisodeRunner(env, ChatTranscript(formatter), EpisodeLimitSettings(6, 1200))


def test_a_tool_taskset_runs_multi_turn_episodes_on_the_endpoint_tokens():
    tokenizer = tool_tokenizer()
    backend = ScriptedBackend(calculator_script)
    runner = tools_runner(tokenizer)
    prompts = [encoded("What is 12+30?", uid="a", gt="42"), encoded("What is 7+8?", gt="15")]
    groups = runner.run(backend.generate, prompts, sampling_params(n=1, max_new_tokens=80))
    # both answer the calculator's sum: the task's reward is 1
    assert [c.given_reward for (c,) in groups] == [1.0, 1.0], [c.failure for (c,) in groups]
    (one,), (three,) = groups
    assert [t["role"] for t in one.turns] == ["model", "env", "model"]
    assert [t["role"] for t in three.turns] == ["model", "env"] * 4 + ["model"]
    env_texts = [t["text"] for t in three.turns if t["role"] == "env"]
    assert "division by zero" in env_texts[0]
    assert "unknown tool 'multiply' (tools: add, divide, wait)" in env_texts[1]
    assert "timed out after 1.0 s" in env_texts[2]  # environment.limits.tool_timeout_s
    assert env_texts[3] == "<|user|>15<|end|><|assistant|>"
    assert one.counts["tool_calls"] == 1 and "tool_errors" not in one.counts
    assert (three.counts["tool_calls"], three.counts["tool_errors"]) == (4, 3)
    failures = {k: three.counts[k] for k in ("tool_failures", "unknown_tools", "tool_timeouts")}
    assert failures == {"tool_failures": 1, "unknown_tools": 1, "tool_timeouts": 1}
    assert three.counts["turns"] == 5
    for prompt, (c,) in zip(prompts, groups, strict=True):
        assert c.failure is None and c.prompt_ids == prompt.prompt_ids
        full = c.prompt_ids + c.token_ids.tolist()
        n = len(c.prompt_ids)
        for turn in c.turns:
            span = full[n + turn["start"] : n + turn["end"]]
            trained = c.loss_mask[turn["start"] : turn["end"]]
            if turn["role"] == "model":  # generated from exactly the tokens before it
                assert (full[: n + turn["start"]], span) in backend.generated
                assert trained.all()
            else:  # the template's text for the tool message, tokenized once, not trained
                assert tokenizer.encode(turn["text"], add_special_tokens=False) == span
                assert not trained.any()
        assert c.turns[-1]["end"] == len(c.token_ids)
