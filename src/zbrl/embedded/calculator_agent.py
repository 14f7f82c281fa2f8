"""The agent of recipes/demo_agent.yaml: solves the tool demo's products through the endpoint
with the ``openai`` client, running the model's ``<calc>…</calc>`` calls itself.

It writes the conversation the built-in tools environment would (``call_format: tags``,
``message_role: user``): the model's turn, then the calculator's results one per line as the next
user message, until a turn calls no tool; that turn's text is the final answer, which the run's
reward scores. The endpoint turns the conversation into the same tokens, so the tool demo's warm
start applies (docs/agents.md).
"""

from __future__ import annotations

from typing import Any

from zbrl.environments.tool_calls import MalformedCall, ParsedCall, parse_tags
from zbrl.environments.tools import Calculator, call_tool

CALCULATOR = Calculator()
TAGS = {CALCULATOR.tag: (CALCULATOR.name, CALCULATOR.argument)}
MAX_TURNS = 3
TOOL_TIMEOUT_S = 5.0


async def solve(client: Any, example: dict[str, Any]) -> str:
    """One episode: the final answer's text (scored by the run's reward)."""
    messages = list(example["messages"])
    text = ""
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        text = reply.choices[0].message.content or ""
        calls = parse_tags(text, TAGS)
        if not calls:
            return text
        messages += _tool_turn(text, calls)
    return text


async def solve_streaming_shortened(client: Any, example: dict[str, Any]) -> str:
    """The same task as :func:`solve`, asked the way many harnesses ask: every call after the
    first streams its answer, and once the model has answered, the agent asks it to confirm,
    re-sending the history with each earlier tool-calling turn shortened to its calls' markup
    (``<calc></calc>``, the expression dropped), as Qwen3's chat template drops past turns'
    reasoning. The endpoint cannot continue that history token-exact, so the confirmation is a
    new segment of the episode (recipes/demo_agent_segments.yaml, docs/agents.md). The answer
    is the answering turn's: the confirmation is asked on a history the embedded model was never
    warm-started on, and it is trained with the episode's reward, not scored."""
    messages = list(example["messages"])
    text = ""
    for turn in range(MAX_TURNS - 1):
        text = await _ask(client, messages, stream=turn > 0)
        calls = parse_tags(text, TAGS)
        if not calls:
            break
        messages += _tool_turn(text, calls)
    else:
        return text  # no answer within the turns: the last turn is scored as it is
    shortened = [_shortened(m) for m in messages]
    confirm = {"role": "user", "content": "Confirm the answer."}
    await _ask(client, [*shortened, {"role": "assistant", "content": text}, confirm], stream=True)
    return text


def _tool_turn(text: str, calls: list[ParsedCall]) -> list[dict[str, Any]]:
    """The model's tool-calling turn ``text`` and the user turn answering its ``calls`` (each
    call's result, or why it is malformed, one a line)."""
    results = [
        f"error: malformed tool call: {c.reason}"
        if isinstance(c, MalformedCall)
        else call_tool(CALCULATOR, c.arguments, TOOL_TIMEOUT_S).text
        for c in calls
    ]
    return [
        {"role": "assistant", "content": text},
        {"role": "user", "content": "\n".join(r.strip() for r in results)},
    ]


async def _ask(client: Any, messages: list[dict[str, Any]], *, stream: bool) -> str:
    if not stream:
        reply = await client.chat.completions.create(model="policy", messages=messages)
        return reply.choices[0].message.content or ""
    chunks = await client.chat.completions.create(model="policy", messages=messages, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])


def _shortened(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn with calls kept as their markup alone; other messages as they are."""
    if message["role"] != "assistant" or not parse_tags(message["content"], TAGS):
        return message
    calls = len(parse_tags(message["content"], TAGS))
    return {**message, "content": f"<{CALCULATOR.tag}></{CALCULATOR.tag}>" * calls}
