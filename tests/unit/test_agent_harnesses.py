"""Agent harnesses people already use, unmodified, trained through the endpoint: the OpenAI
Agents SDK (its Responses model and its Chat Completions model) and smolagents'
ToolCallingAgent. Each runs agent episodes through the episode runner against a scripted model
that calls a calculator tool; every episode must end with the right answer, token-exact, with no
failure. smolagents re-serialises its history (its tool calls as text), so its episodes go on
in segments. Tests skip when a harness is not installed (``pip install openai-agents
smolagents``); the module is in the slow tier."""

import asyncio

import pytest
from episode_stubs import EOS, ScriptedBackend, encoded
from harness_backend import TOKENIZER, hermes_calculator, product_value
from role_settings import sampling_params
from test_agent_episodes import agent_runner

pytestmark = pytest.mark.slow  # importing a harness takes seconds of CPU

PARAMS = sampling_params(n=2, max_new_tokens=200)


def run_agent(agent):
    backend = ScriptedBackend(hermes_calculator)
    backend.tokenizer = TOKENIZER
    runner = agent_runner(agent, tokenizer=TOKENIZER, eos_ids=frozenset({EOS}))
    runner.limits = type(runner.limits)(8, 4000)
    prompts = [encoded("What is 12*34?", uid="a"), encoded("What is 7*8?", uid="b")]
    return backend, runner.run(backend.generate, prompts, PARAMS)


def check(groups, answers, backend):
    """No failure, the right answer, and every model turn of every segment is a generation
    given exactly the tokens before it."""
    for group, answer in zip(groups, answers, strict=True):
        for c in group:
            assert c.failure is None, c.failure
            assert answer in c.text
            segments = [(c.prompt_ids, c.token_ids)]
            segments += [(s.prompt_ids, s.response_ids) for s in c.segments]
            for k, (prompt, ids) in enumerate(segments):
                full, n = prompt + ids.tolist(), len(prompt)
                turns = [t for t in c.turns if t["role"] == "model" and t.get("segment", 0) == k]
                assert turns
                for t in turns:
                    generated = (full[: n + t["start"]], full[n + t["start"] : n + t["end"]])
                    assert generated in backend.generated


def openai_agents_runner(model_kind):
    agents = pytest.importorskip("agents", reason="pip install openai-agents")
    agents.set_tracing_disabled(True)

    @agents.function_tool(name_override="calc")
    def calculator(x: str) -> str:
        """The value of a product such as 12*34."""
        return product_value(x)

    async def run(client, example):
        model_cls = (
            agents.OpenAIResponsesModel
            if model_kind == "responses"
            else agents.OpenAIChatCompletionsModel
        )
        agent = agents.Agent(
            name="calculator",
            instructions="Compute products with the calculator.",
            tools=[calculator],
            model=model_cls(model="policy", openai_client=client),
        )
        result = await agents.Runner.run(agent, example["messages"][-1]["content"], max_turns=4)
        return str(result.final_output)

    return run


@pytest.mark.parametrize("model_kind", ["responses", "chat"])
def test_openai_agents_sdk_trains_through_the_endpoint(model_kind):
    backend, groups = run_agent(openai_agents_runner(model_kind))
    check(groups, ["408", "56"], backend)
    for c in (c for g in groups for c in g):
        assert c.counts["segments"] == 1 and c.counts["turns"] == 2


def test_smolagents_trains_through_the_endpoint_in_segments():
    smolagents = pytest.importorskip("smolagents", reason="pip install smolagents")

    @smolagents.tool
    def calc(x: str) -> str:
        """The value of a product.

        Args:
            x: a product such as 12*34.
        """
        return product_value(x)

    async def run(client, example):
        model = smolagents.OpenAIServerModel(
            model_id="policy", api_base=str(client.base_url), api_key=client.api_key
        )
        agent = smolagents.ToolCallingAgent(
            tools=[calc], model=model, max_steps=4, verbosity_level=0
        )
        task = example["messages"][-1]["content"]
        return str(await asyncio.to_thread(agent.run, task))

    backend, groups = run_agent(run)
    check(groups, ["408", "56"], backend)
    for c in (c for g in groups for c in g):
        assert c.counts["turns"] == 2 and c.counts["segments"] == 2, c.counts
