"""Agent harnesses through the endpoint: episodes/s and failures per harness.

Each harness runs the same agent episodes — a product of two numbers, solved with a calculator
tool the harness calls, then answered — through the episode runner and the endpoint (in this
process, no Ray, no training), against a scripted model that writes Hermes ``<tool_call>``
blocks (no generation cost: what is measured is the harness, the HTTP round trips and the
endpoint's rendering). The harnesses: the ``openai`` client by hand (chat, chat streaming, the
Responses API), the OpenAI Agents SDK (``openai-agents``: its Responses and its Chat
Completions model) and smolagents' ``ToolCallingAgent`` (which re-serialises its history, so its
episodes go on in segments). A harness that is not installed is listed as such.

    python bench/agent_harnesses.py                # 16 prompts x 8 samples, 2 repeats
    python bench/agent_harnesses.py --prompts 4 --repeats 1
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from zbrl.embedded.tokenizer import build_tokenizer
from zbrl.rollout.agents.environment import AgentEnvironment, AgentSettings
from zbrl.rollout.agents.launch import AgentLauncher
from zbrl.rollout.backends.base import Completion, SamplingParams
from zbrl.rollout.endpoint.conversation import Renderer
from zbrl.rollout.endpoint.server import Endpoint, EndpointSettings
from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
from zbrl.rollout.transcripts import ChatTranscript
from zbrl.types import EncodedPrompt

TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>tools: "
    "{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}"
    "{{ eos_token }}{% endif %}{% for m in messages %}"
    "{% if m.role == 'tool' %}<|user|>result: {{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'assistant' %}<|assistant|>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{% endfor %}{{ eos_token }}"
    "{% else %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PRODUCT = re.compile(r"(\d+)\s*\*\s*(\d+)")
VALUE = re.compile(r"value (\d+)")


def product_value(x: str) -> str:
    a, b = PRODUCT.search(x).groups()
    return f"value {int(a) * int(b)}"


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class HermesModel:
    """Calls ``calc`` on the task's product, then answers with its value (through
    ``final_answer`` when the request declares that tool)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id

    def turn(self, context: str) -> str:
        values = VALUE.findall(context)
        if not values:
            a, b = PRODUCT.search(context.split("<|user|>", 1)[-1]).groups()
            return _call("calc", {"x": f"{a}*{b}"})
        if "final_answer" in context.split("<|end|>", 1)[0]:
            return _call("final_answer", {"answer": values[-1]})
        return f"The product is {values[-1]}."

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        out = []
        for p in prompts:
            text = self.turn(self.tokenizer.decode(p, skip_special_tokens=False))
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.eos]
            ids = ids[: params.max_new_tokens]
            out.append(
                [
                    Completion(
                        torch.tensor(ids),
                        torch.full((len(ids),), -0.1),
                        text,
                        "stop",
                    )
                ]
                * params.n
            )
        return out


def by_hand_chat(stream: bool) -> Callable[..., Any]:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calc",
                "description": "The value of a product such as 12*34.",
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        }
    ]

    async def run(client: Any, example: dict[str, Any]) -> str:
        messages = list(example["messages"])
        for _ in range(4):
            if stream:
                chunks = await client.chat.completions.create(
                    model="policy", messages=messages, tools=tools, stream=True
                )
                text, calls = "", {}
                async for c in chunks:
                    delta = c.choices[0].delta
                    text += delta.content or ""
                    for d in delta.tool_calls or []:
                        call = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                        call["name"] += (d.function.name or "") if d.function else ""
                        call["arguments"] += (d.function.arguments or "") if d.function else ""
                message = {"role": "assistant", "content": text}
                if calls:
                    message["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]},
                        }
                        for c in calls.values()
                    ]
            else:
                reply = await client.chat.completions.create(
                    model="policy", messages=messages, tools=tools
                )
                message = reply.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            if not message.get("tool_calls"):
                return message["content"]
            for call in message["tool_calls"]:
                x = json.loads(call["function"]["arguments"])["x"]
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": product_value(x)}
                )
        return ""

    return run


def by_hand_responses() -> Callable[..., Any]:
    tools = [
        {
            "type": "function",
            "name": "calc",
            "description": "The value of a product such as 12*34.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        }
    ]

    async def run(client: Any, example: dict[str, Any]) -> str:
        response = await client.responses.create(
            model="policy", input=example["messages"][-1]["content"], tools=tools
        )
        for _ in range(4):
            calls = [o for o in response.output if o.type == "function_call"]
            if not calls:
                return response.output_text
            outputs = [
                {
                    "type": "function_call_output",
                    "call_id": c.call_id,
                    "output": product_value(json.loads(c.arguments)["x"]),
                }
                for c in calls
            ]
            response = await client.responses.create(
                model="policy", previous_response_id=response.id, input=outputs, tools=tools
            )
        return ""

    return run


def openai_agents(kind: str) -> Callable[..., Any] | None:
    try:
        import agents
    except ImportError:
        return None
    agents.set_tracing_disabled(True)

    @agents.function_tool(name_override="calc")
    def calculator(x: str) -> str:
        """The value of a product such as 12*34."""
        return product_value(x)

    model_cls = (
        agents.OpenAIResponsesModel if kind == "responses" else agents.OpenAIChatCompletionsModel
    )

    async def run(client: Any, example: dict[str, Any]) -> str:
        agent = agents.Agent(
            name="calculator",
            instructions="Compute products with the calculator.",
            tools=[calculator],
            model=model_cls(model="policy", openai_client=client),
        )
        result = await agents.Runner.run(agent, example["messages"][-1]["content"], max_turns=4)
        return str(result.final_output)

    return run


def smolagents_tool_calling() -> Callable[..., Any] | None:
    try:
        import smolagents
    except ImportError:
        return None

    @smolagents.tool
    def calc(x: str) -> str:
        """The value of a product.

        Args:
            x: a product such as 12*34.
        """
        return product_value(x)

    async def run(client: Any, example: dict[str, Any]) -> str:
        model = smolagents.OpenAIServerModel(
            model_id="policy", api_base=str(client.base_url), api_key=client.api_key
        )
        agent = smolagents.ToolCallingAgent(
            tools=[calc], model=model, max_steps=4, verbosity_level=0
        )
        return str(await asyncio.to_thread(agent.run, example["messages"][-1]["content"]))

    return run


HARNESSES: dict[str, Callable[[], Callable[..., Any] | None]] = {
    "openai client, chat": lambda: by_hand_chat(stream=False),
    "openai client, chat, stream": lambda: by_hand_chat(stream=True),
    "openai client, responses (previous_response_id)": by_hand_responses,
    "OpenAI Agents SDK, Responses model": lambda: openai_agents("responses"),
    "OpenAI Agents SDK, Chat Completions model": lambda: openai_agents("chat"),
    "smolagents ToolCallingAgent": smolagents_tool_calling,
}


def measure(agent: Callable[..., Any], prompts: list[EncodedPrompt], group: int, repeats: int):
    tokenizer = copy.deepcopy(build_tokenizer())
    tokenizer.chat_template = TEMPLATE
    model = HermesModel(tokenizer)
    endpoint = Endpoint(
        Renderer(tokenizer, {model.eos}),
        EndpointSettings("127.0.0.1", 0, 0.02, 256, 60.0),
        "policy",
    )
    env = AgentEnvironment(endpoint, AgentLauncher(agent, None), AgentSettings("segment", 60.0, 0))
    runner = EpisodeRunner(
        env, ChatTranscript(endpoint.renderer.formatter), EpisodeLimitSettings(8, 4000)
    )
    params = SamplingParams(group, 1.0, 1.0, -1, 200, ())
    runner.run(model.generate, prompts[:1], params)  # warm-up: endpoint start, imports
    episodes = failures = segments = right = 0
    started = time.perf_counter()
    for _ in range(repeats):
        for p, group_episodes in zip(
            prompts, runner.run(model.generate, prompts, params), strict=True
        ):
            for c in group_episodes:
                episodes += 1
                failures += c.failure is not None
                segments += c.counts.get("segments", 0)
                right += c.failure is None and p.example["gt_answer"] in c.text
    wall = time.perf_counter() - started
    endpoint.stop()
    return Measured(episodes, episodes / wall, failures, right, segments / max(1, episodes), wall)


@dataclass
class Measured:
    episodes: int
    rate: float
    failures: int
    right: int
    segments: float
    wall: float


def prompts_of(n: int, tokenizer: Any) -> list[EncodedPrompt]:
    out = []
    for i in range(n):
        messages = [{"role": "user", "content": f"What is {12 + i}*{34 + 2 * i}?"}]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids
        answer = str((12 + i) * (34 + 2 * i))
        out.append(EncodedPrompt(f"p:{i}", list(ids), {"messages": messages, "gt_answer": answer}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = copy.deepcopy(build_tokenizer())
    tokenizer.chat_template = TEMPLATE
    prompts = prompts_of(args.prompts, tokenizer)
    columns = [
        "episodes",
        "episodes/s",
        "failures",
        "right answers",
        "segments/episode",
        "wall (s)",
    ]
    print("| harness | " + " | ".join(columns) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, make in HARNESSES.items():
        agent = make()
        if agent is None:
            print(f"| {name} | not installed | | | | | |")
            continue
        m = measure(agent, prompts, args.group, args.repeats)
        print(
            f"| {name} | {m.episodes} | {m.rate:.1f} | {m.failures} | {m.right} | "
            f"{m.segments:.2f} | {m.wall:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
