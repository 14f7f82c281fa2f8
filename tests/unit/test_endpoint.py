"""The OpenAI-compatible endpoint (zbrl.rollout.endpoint): an ``openai`` client talks to the
policy; every call's tokens are recorded per episode, token-exact, and a request that rewrites the
episode's history is refused and counted."""

import contextlib
import json
import logging
import socket
import struct
import threading
import time
from urllib.parse import urlsplit

import openai
import pytest
from episode_stubs import EOS, TOKENIZER, ScriptedBackend
from role_settings import sampling_params

from zbrl.rollout.endpoint.calls import serve_calls
from zbrl.rollout.endpoint.conversation import Renderer
from zbrl.rollout.endpoint.server import Endpoint, EndpointSettings, EpisodeBudget

SETTINGS = EndpointSettings(
    host="127.0.0.1", port=0, batch_window_s=0.01, max_batch=8, request_timeout_s=30
)


def calc_then_answer(context, sample):
    """A calculator call on the question; once a result is in the context, answers with it."""
    turns = context.split("<|user|>")
    if len(turns) < 3:
        return f"<calc>{turns[1].split('<|end|>')[0]}</calc>"
    return f"<answer>{turns[-1].split('<|end|>')[0]}</answer>"


@contextlib.contextmanager
def serving(backend, tokenizer=TOKENIZER, *, max_new_tokens=40, max_batch=3):
    """An endpoint on ``tokenizer`` whose calls a background thread answers with ``backend``
    (``max_batch`` calls at a time), stopped on exit."""
    endpoint = Endpoint(Renderer(tokenizer, {EOS}), SETTINGS, "policy")
    endpoint.episode_params = sampling_params(n=1, temperature=1.0, max_new_tokens=max_new_tokens)
    endpoint.start()
    stop = threading.Event()
    thread = threading.Thread(
        target=serve_calls, args=(endpoint.queue, backend.generate, max_batch, stop), daemon=True
    )
    thread.start()
    try:
        yield endpoint
    finally:
        stop.set()
        thread.join()
        endpoint.stop()


@pytest.fixture
def served():
    """An endpoint whose calls a background thread answers with a scripted backend."""
    backend = ScriptedBackend(calc_then_answer)
    with serving(backend) as endpoint:
        yield endpoint, backend


def client(endpoint, key):
    return openai.OpenAI(base_url=endpoint.base_url, api_key=key, max_retries=0)


def test_chat_episode_is_recorded_token_exact(served):
    endpoint, backend = served
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=200))
    api = client(endpoint, key)
    messages = [{"role": "user", "content": "12*34"}]
    first = api.chat.completions.create(model="policy", messages=messages)
    assert first.choices[0].message.content == "<calc>12*34</calc>"
    assert first.usage.completion_tokens == len("<calc>12*34</calc>") + 1  # chars + EOS
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "user", "content": "408"}]
    second = api.chat.completions.create(model="policy", messages=messages)
    assert second.choices[0].message.content == "<answer>408</answer>"
    assert [m.id for m in api.models.list().data] == ["policy"]

    tokens = endpoint.close_episode(key)
    # the same ids the built-in tool environment trains on: the model's turns as generated, the
    # calculator's message rendered once after them
    assert TOKENIZER.decode(tokens.ids) == (
        "<|bos|><|user|>12*34<|end|><|assistant|><calc>12*34</calc><|end|>"
        "<|user|>408<|end|><|assistant|><answer>408</answer><|end|>"
    )
    # every trained token is one the backend generated, in the context it was given
    (ctx1, gen1), (ctx2, gen2) = backend.generated
    assert tokens.ids == ctx2 + gen2 and ctx2[: len(ctx1) + len(gen1)] == ctx1 + gen1
    trained = [i for i, m in zip(tokens.ids, tokens.mask, strict=True) if m]
    assert trained == gen1 + gen2
    assert tokens.prompt_len == len(ctx1)
    assert [c["version"] for c in tokens.calls] == [3, 3]
    assert [c["completion_ids"] for c in tokens.calls] == [gen1, gen2]
    assert set(tokens.versions[tokens.prompt_len :]) == {3}
    assert [lp for lp, m in zip(tokens.logprobs, tokens.mask, strict=True) if not m] == [0.0] * (
        len(tokens.ids) - len(trained)
    )


def test_changed_history_is_refused_and_counted(served):
    endpoint, _ = served
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=200))
    api = client(endpoint, key)
    messages = [{"role": "user", "content": "12*34"}]
    api.chat.completions.create(model="policy", messages=messages)
    edited = [*messages, {"role": "assistant", "content": "<calc>12*35</calc>"}]
    with pytest.raises(openai.APIStatusError) as e:
        api.chat.completions.create(
            model="policy", messages=[*edited, {"role": "user", "content": "420"}]
        )
    assert e.value.status_code == 409 and e.value.code == "prefix_mismatch"
    tokens = endpoint.close_episode(key)
    assert tokens.counts == {"prefix_mismatches": 1} and len(tokens.calls) == 1


def test_unknown_key_limits_and_tool_calls(served):
    endpoint, _ = served
    with pytest.raises(openai.AuthenticationError):
        client(endpoint, "nobody").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "1"}]
        )
    # past max_turns the episode ends, truncated: an empty "length" answer, counted
    key = endpoint.open_episode(EpisodeBudget(max_calls=1, max_total_tokens=200))
    api = client(endpoint, key)
    messages = [{"role": "user", "content": "1"}]
    first = api.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    late = api.chat.completions.create(
        model="policy", messages=[*messages, {"role": "user", "content": "2"}]
    )
    assert (late.choices[0].message.content, late.choices[0].finish_reason) == ("", "length")
    tokens = endpoint.close_episode(key)
    assert tokens.counts == {"turn_limit": 1} and tokens.ended and len(tokens.calls) == 1
    # a message that leaves no room ends the episode and is not kept
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=25))
    api = client(endpoint, key)
    messages = [{"role": "user", "content": "12*34"}]
    first = api.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    late = api.chat.completions.create(
        model="policy", messages=[*messages, {"role": "user", "content": "4" * 30}]
    )
    assert late.choices[0].finish_reason == "length"
    tokens = endpoint.close_episode(key)
    assert tokens.counts == {"token_limit": 1}
    assert tokens.ids == tokens.ids[: tokens.prompt_len] + tokens.calls[0]["completion_ids"]


def test_the_episode_header_names_the_episode_over_the_bearer_key(served):
    endpoint, _ = served
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=200))
    api = openai.OpenAI(
        base_url=endpoint.base_url,
        api_key="EMPTY",
        max_retries=0,
        default_headers={"X-Zbrl-Episode": key},
    )
    reply = api.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1"}])
    assert reply.choices[0].message.content == "<calc>1</calc>"
    assert len(endpoint.close_episode(key).calls) == 1


def test_hermes_tool_calls_come_back_as_openai_tool_calls():
    from zbrl.rollout.endpoint.openai_api import assistant_message, chat_response

    text = 'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"x": "2*3"}}\n</tool_call>'
    message = assistant_message(text, parse_tools=True)
    assert message["content"] == "Let me compute."
    wire = chat_response("m", message, "stop", 3, 4)["choices"][0]
    assert wire["finish_reason"] == "tool_calls"
    assert wire["message"]["tool_calls"][0]["function"] == {
        "name": "calc",
        "arguments": '{"x": "2*3"}',
    }
    assert assistant_message(text, parse_tools=False) == {"role": "assistant", "content": text}


def test_completions_continue_the_episode_text(served):
    endpoint, backend = served
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=200))
    api = client(endpoint, key)
    prompt = "<|bos|><|user|>7*8<|end|><|assistant|>"
    out = api.completions.create(model="policy", prompt=prompt)
    assert out.choices[0].text == "<calc>7*8</calc>"
    following = prompt + "<calc>7*8</calc><|end|><|user|>56<|end|><|assistant|>"
    assert api.completions.create(model="policy", prompt=following).choices[0].text == (
        "<answer>56</answer>"
    )
    tokens = endpoint.close_episode(key)
    assert tokens.ids == backend.generated[1][0] + backend.generated[1][1]
    with pytest.raises(openai.AuthenticationError):
        api.completions.create(model="policy", prompt=prompt)  # the episode is closed


def test_a_request_its_client_abandons_is_counted_and_logged_in_one_line(caplog, capfd):
    """The client sends a request and closes its socket (with a reset) before the answer: the
    endpoint counts it on the episode and logs one line, no traceback."""

    def slow(context, sample):
        time.sleep(0.3)  # the client is gone by the time the answer is written
        return "<answer>1</answer>"

    backend = ScriptedBackend(slow)
    endpoint = Endpoint(Renderer(TOKENIZER, {EOS}), SETTINGS, "policy")
    endpoint.episode_params = sampling_params(n=1, temperature=1.0, max_new_tokens=40)
    url = urlsplit(endpoint.start())
    stop = threading.Event()
    thread = threading.Thread(
        target=serve_calls, args=(endpoint.queue, backend.generate, 0, stop), daemon=True
    )
    thread.start()
    key = endpoint.open_episode(EpisodeBudget(max_calls=4, max_total_tokens=200))
    body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "1"}]})
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    )
    caplog.set_level(logging.WARNING, logger="zbrl.rollout.endpoint.server")
    try:
        with socket.create_connection((url.hostname, url.port)) as sock:
            sock.sendall(request.encode())
            while not backend.contexts:  # the request is being answered
                time.sleep(0.01)
            # close with a reset (linger 0): the endpoint's write fails at once
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join()
        endpoint.stop()
    tokens = endpoint.close_episode(key)
    assert tokens.counts == {"abandoned_requests": 1}
    assert len(tokens.calls) == 1  # what the call generated stays in the episode
    (record,) = caplog.records
    assert "closed its connection before the answer" in record.getMessage()
    assert record.exc_info is None
    assert "Traceback" not in capfd.readouterr().err
