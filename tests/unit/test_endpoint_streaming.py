"""Streaming from the endpoint: ``stream: true`` answers are server-sent events synthesized from
the finished generation, read by the real ``openai`` client; the tokens recorded are the ones a
non-streaming episode records."""

import json

import pytest
from episode_stubs import ScriptedBackend
from test_endpoint import calc_then_answer, client, serving

from zbrl.rollout.endpoint import streaming
from zbrl.rollout.endpoint.openai_api import assistant_message, chat_response
from zbrl.rollout.endpoint.server import EpisodeBudget


@pytest.fixture
def served():
    with serving(ScriptedBackend(calc_then_answer)) as endpoint:
        yield endpoint


def _episode(endpoint, stream_second):
    """Two calls of a calculator episode; the second streamed or not; the recorded tokens and
    the second answer's text, finish reason and usage."""
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=200))
    api = client(endpoint, key)
    messages = [{"role": "user", "content": "12 * 34"}]
    first = api.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "user", "content": "408"}]
    if not stream_second:
        second = api.chat.completions.create(model="policy", messages=messages)
        choice = second.choices[0]
        answer = (choice.message.content, choice.finish_reason, second.usage.completion_tokens)
    else:
        chunks = list(
            api.chat.completions.create(
                model="policy",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
        assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
        answer = (text, finishes[-1], chunks[-1].usage.completion_tokens)
    return endpoint.close_episode(key), answer


def test_a_streamed_call_records_the_tokens_a_plain_call_does(served):
    plain, plain_answer = _episode(served, stream_second=False)
    streamed, streamed_answer = _episode(served, stream_second=True)
    assert streamed_answer == plain_answer == ("<answer>408</answer>", "stop", 6)
    assert streamed.ids == plain.ids
    assert streamed.mask == plain.mask
    assert streamed.logprobs[: plain.prompt_len] == plain.logprobs[: plain.prompt_len]
    assert [c["completion_ids"] for c in streamed.calls] == [
        c["completion_ids"] for c in plain.calls
    ]


def test_completions_stream_their_text(served):
    key = served.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=200))
    api = client(served, key)
    prompt = "<|bos|><|user|>7*8<|end|><|assistant|>"
    chunks = list(api.completions.create(model="policy", prompt=prompt, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "<calc>7*8</calc>"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert len(served.close_episode(key).calls) == 1


def test_tool_calls_stream_as_openai_deltas():
    text = (
        'Computing.\n<tool_call>\n{"name": "calc", "arguments": {"x": "2*3"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calc", "arguments": {"x": "4"}}\n</tool_call>'
    )
    payload = chat_response("m", assistant_message(text, parse_tools=True), "stop", 3, 4)
    chunks = streaming.chat_chunks(payload, include_usage=False)
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in c["choices"][0]["delta"].get("tool_calls") or []:
            call = calls.setdefault(d["index"], {"id": None, "name": "", "arguments": ""})
            call["id"] = d.get("id") or call["id"]
            call["name"] += d.get("function", {}).get("name", "")
            call["arguments"] += d["function"].get("arguments", "")
    wire = payload["choices"][0]["message"]["tool_calls"]
    assert [calls[i] for i in sorted(calls)] == [
        {"id": w["id"], "name": "calc", "arguments": w["function"]["arguments"]} for w in wire
    ]
    assert [json.loads(calls[i]["arguments"]) for i in (0, 1)] == [{"x": "2*3"}, {"x": "4"}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Computing."


def test_pieces_join_back_exactly():
    for text in ["", " ", "a", "  two words\n\nand\ttabs  ", "<calc>1*2</calc>"]:
        assert "".join(streaming.pieces(text)) == text
