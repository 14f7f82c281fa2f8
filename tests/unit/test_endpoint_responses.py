"""The Responses API on the endpoint (``/v1/responses``), read by the real ``openai`` client:
text and item input, instructions, function tools and their outputs, ``previous_response_id``
within an episode, streaming; recorded on the same token-exact episode record as chat."""

import json

import openai
import pytest
from endpoint_templates import tokenizer
from episode_stubs import ScriptedBackend
from test_endpoint import serving

from zbrl.rollout.endpoint.server import EpisodeBudget

TOKENIZER = tokenizer()
CALC = {
    "type": "function",
    "name": "calc",
    "description": "evaluates a product",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
}


def call_then_answer(context, sample):
    """A Hermes call on the question; once a result is in the context, answers with it."""
    if "result: " in context:
        return "<answer>" + context.rsplit("result: ", 1)[1].split("<|end|>")[0] + "</answer>"
    question = context.rsplit("<|user|>", 1)[1].split("<|end|>")[0]
    call = {"name": "calc", "arguments": {"x": question}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


@pytest.fixture
def served():
    backend = ScriptedBackend(call_then_answer)
    backend.tokenizer = TOKENIZER
    with serving(backend, TOKENIZER, max_new_tokens=200, max_batch=2) as endpoint:
        yield endpoint, backend


def _client(endpoint, key):
    return openai.OpenAI(base_url=endpoint.base_url, api_key=key, max_retries=0)


def test_a_tool_episode_over_the_responses_api_is_token_exact(served):
    endpoint, backend = served
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=1000))
    api = _client(endpoint, key)
    first = api.responses.create(model="policy", instructions="be brief", input="6*7", tools=[CALC])
    (call,) = first.output
    assert call.type == "function_call" and call.name == "calc"
    assert json.loads(call.arguments) == {"x": "6*7"}
    # the Agents SDK's way: re-send the whole input, the output items as they came
    items = [{"role": "user", "content": "6*7"}, call.model_dump(exclude_none=True)]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "42"})
    second = api.responses.create(
        model="policy", instructions="be brief", input=items, tools=[CALC]
    )
    assert second.output_text == "<answer>42</answer>" and second.status == "completed"
    assert second.usage.output_tokens == len(backend.generated[1][1])

    tokens = endpoint.close_episode(key)
    assert tokens.counts == {}
    (ctx1, gen1), (ctx2, gen2) = backend.generated
    assert tokens.ids == ctx2 + gen2 and ctx2[: len(ctx1) + len(gen1)] == ctx1 + gen1
    assert [i for i, m in zip(tokens.ids, tokens.mask, strict=True) if m] == gen1 + gen2
    rendered = TOKENIZER.decode(ctx2[len(ctx1) + len(gen1) :])
    assert rendered == "<|user|>result: 42<|end|><|assistant|>"
    assert TOKENIZER.decode(ctx1).startswith(
        "<|bos|><|system|>tools: calc<|end|><|system|>be brief"
    )


def test_previous_response_id_continues_the_episode(served):
    endpoint, backend = served
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=1000))
    api = _client(endpoint, key)
    first = api.responses.create(model="policy", input="6*7", tools=[CALC])
    output = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "42"}
    second = api.responses.create(
        model="policy", previous_response_id=first.id, input=[output], tools=[CALC]
    )
    assert second.output_text == "<answer>42</answer>"
    tokens = endpoint.close_episode(key)
    assert tokens.counts == {} and len(tokens.calls) == 2
    assert tokens.ids == backend.generated[1][0] + backend.generated[1][1]
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=1000))
        _client(endpoint, key).responses.create(
            model="policy", previous_response_id=first.id, input="again"
        )


def test_a_streamed_response_has_the_events_of_the_answer(served):
    endpoint, _ = served
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=1000))
    api = _client(endpoint, key)
    events = list(api.responses.create(model="policy", input="6*7", tools=[CALC], stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert json.loads(arguments) == {"x": "6*7"}
    final = events[-1].response
    assert final.output[0].arguments == arguments
    events = list(
        api.responses.create(
            model="policy",
            previous_response_id=final.id,
            input=[
                {"type": "function_call_output", "call_id": final.output[0].call_id, "output": "42"}
            ],
            tools=[CALC],
            stream=True,
        )
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == "<answer>42</answer>"
    assert len(endpoint.close_episode(key).calls) == 2


def test_unsupported_input_is_refused_by_name(served):
    endpoint, _ = served
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=1000))
    api = _client(endpoint, key)
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        api.responses.create(model="policy", input="1", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="input_image"):
        api.responses.create(
            model="policy",
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
        )
