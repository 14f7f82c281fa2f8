"""The endpoint as a hostile client sees it: every malformed request gets a 4xx with a message
naming what is wrong (a 500 only for zbrl's own fault, logged once), nothing reaches the model
that does not fit its context, and the server answers the next good request after each."""

import http.client
import json
import logging
import threading
from urllib.parse import urlsplit

import pytest
from episode_stubs import EOS, TOKENIZER, ScriptedBackend

from zbrl.rollout.backends.base import one_sample
from zbrl.rollout.endpoint.calls import serve_calls
from zbrl.rollout.endpoint.conversation import Renderer
from zbrl.rollout.endpoint.server import Endpoint, EndpointSettings

KEY = "s3cret"
CONTEXT = 64
MAX_BYTES = 300_000
GOOD = {"messages": [{"role": "user", "content": "1+2"}], "max_tokens": 4}


def _script(context, sample):
    if "boom" in context:
        raise RuntimeError("the backend broke")
    return "3"


@pytest.fixture(scope="module")
def server():
    """``zbrl serve``'s endpoint (a key, a 64-token context, a 300 kB body limit) over a
    scripted backend: one per module."""
    backend = ScriptedBackend(_script)
    settings = EndpointSettings(
        "127.0.0.1", 0, 0.0, 8, 30.0, context_len=CONTEXT, max_request_bytes=MAX_BYTES, api_key=KEY
    )
    endpoint = Endpoint(Renderer(TOKENIZER, {EOS}), settings, "m", serve_params=one_sample(0, 8))
    endpoint.start()
    stop = threading.Event()
    thread = threading.Thread(
        target=serve_calls, args=(endpoint.queue, backend.generate, 0, stop), daemon=True
    )
    thread.start()
    yield urlsplit(endpoint.base_url), backend
    stop.set()
    thread.join()
    endpoint.stop()


def send(url, body, *, path="/v1/chat/completions", key=KEY, headers=None, method="POST"):
    """(status, error message or the answer) of one raw request on its own connection."""
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Authorization": f"Bearer {key}"} if key else {}
    if headers is None or "Content-Length" not in headers:
        sent["Content-Length"] = str(len(data))
    sent.update(headers or {})
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in sent.items():
            conn.putheader(name, value)
        conn.endheaders()
        if method == "POST" and "Content-Length" not in (headers or {}):
            conn.send(data)
        response = conn.getresponse()
        payload = json.loads(response.read())
    finally:
        conn.close()
    if response.status != 200:
        assert set(payload["error"]) >= {"message", "code"}, payload
        return response.status, payload["error"]["code"], payload["error"]["message"]
    return response.status, None, payload


def still_answers(url):
    status, _, payload = send(url, GOOD)
    assert status == 200 and payload["choices"][0]["message"]["content"] == "3"


def chat(**fields):
    return {**GOOD, **fields}


BAD_BODIES = [  # (body, status, code, what the message says)
    (chat(temperature="hot"), 400, "invalid_request", "temperature must be a number in [0, 2]"),
    (chat(temperature=2.5), 400, "invalid_request", "temperature must be in [0, 2], not 2.5"),
    (chat(temperature=True), 400, "invalid_request", "temperature must be a number"),
    (chat(top_p=0), 400, "invalid_request", "top_p must be in (0, 1], not 0"),
    (chat(max_tokens="5"), 400, "invalid_request", "max_tokens must be a positive integer"),
    (chat(max_tokens=0), 400, "invalid_request", "max_tokens must be a positive integer"),
    (chat(stop=5), 400, "invalid_request", "stop must be a string or a list"),
    (chat(stop=["a", 1]), 400, "invalid_request", "stop must be a string or a list"),
    (chat(n="2"), 400, "invalid_request", "n must be an integer"),
    (chat(n=2), 400, "invalid_request", "n must be 1"),
    (chat(stream="yes"), 400, "invalid_request", "stream must be true or false"),
    (chat(tools="calc"), 400, "invalid_request", "tools must be a list"),
    (chat(tools=[{"type": "function"}]), 400, "invalid_request", "tools[0] must be"),
    (chat(messages=[]), 400, "invalid_request", "messages must be a non-empty list"),
    (chat(messages="hi"), 400, "invalid_request", "messages must be a non-empty list"),
    (chat(messages=[{"role": "wizard", "content": "x"}]), 400, "invalid_request", "role must be"),
    (chat(messages=[{"role": "user", "content": 5}]), 400, "invalid_request", "content must be"),
    (
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
        "invalid_request",
        "messages[0].content[0] must be a text part",
    ),
    ([1, 2], 400, "invalid_request", "must be a JSON object, not a list"),
    (b"{not json", 400, "invalid_json", "the body is not JSON"),
    (b"\xff\xfe", 400, "invalid_json", "the body is not JSON"),
]


@pytest.mark.parametrize("body,status,code,says", BAD_BODIES)
def test_a_malformed_body_is_a_4xx_with_its_reason(server, body, status, code, says):
    url, _ = server
    assert send(url, body)[:2] == (status, code)
    assert says in send(url, body)[2]
    still_answers(url)


def test_content_parts_are_read_as_text(server):
    url, backend = server
    parts = [{"type": "text", "text": "1+"}, {"type": "text", "text": "2"}]
    status = send(url, chat(messages=[{"role": "user", "content": parts}]))[0]
    assert status == 200
    assert "1+2" in TOKENIZER.decode(backend.contexts[-1])


@pytest.mark.parametrize(
    "value,status,code",
    [("abc", 400, "invalid_content_length"), ("-1", 400, "invalid_content_length")],
)
def test_a_malformed_content_length_is_a_400(server, value, status, code):
    url, _ = server
    result = send(url, GOOD, headers={"Content-Length": value})
    assert result[:2] == (status, code) and value in result[2]
    still_answers(url)


def test_a_body_over_the_limit_is_refused_before_it_is_read(server):
    url, _ = server
    status, code, message = send(url, GOOD, headers={"Content-Length": str(MAX_BYTES + 1)})
    assert (status, code) == (413, "request_too_large")
    assert f"{MAX_BYTES + 1} bytes" in message and str(MAX_BYTES) in message
    still_answers(url)


def test_a_prompt_past_the_context_is_refused_before_the_model(server):
    url, backend = server
    calls = len(backend.contexts)
    huge = chat(messages=[{"role": "user", "content": "7" * 200_000}])
    status, code, message = send(url, huge)
    assert (status, code) == (400, "context_length_exceeded")
    assert f"maximum context length is {CONTEXT} tokens" in message
    assert "200000 characters" in message
    # within the bound, counted exactly after the template: prompt + max_tokens past 64
    text = TOKENIZER.apply_chat_template(
        GOOD["messages"], tokenize=False, add_generation_prompt=True
    )
    n_prompt = len(TOKENIZER.encode(text, add_special_tokens=False))
    status, code, message = send(url, chat(max_tokens=CONTEXT))
    assert (status, code) == (400, "context_length_exceeded")
    assert f"{n_prompt} tokens in the prompt and {CONTEXT} in the completion" in message
    assert len(backend.contexts) == calls  # neither reached the model
    status, _, payload = send(url, chat(max_tokens=CONTEXT - n_prompt))
    assert status == 200 and payload["usage"]["prompt_tokens"] == n_prompt
    still_answers(url)


def test_a_request_without_the_key_is_a_401(server):
    url, _ = server
    assert send(url, GOOD, key=None)[:2] == (401, "invalid_api_key")
    assert send(url, GOOD, key="wrong")[:2] == (401, "invalid_api_key")
    assert send(url, b"", path="/v1/models", key=None, method="GET")[:2] == (401, "invalid_api_key")
    assert send(url, b"", path="/v1/models", method="GET")[0] == 200
    still_answers(url)


def test_an_unknown_path_is_a_404(server):
    url, _ = server
    assert send(url, GOOD, path="/v1/embeddings")[:2] == (404, "not_found")
    still_answers(url)


def test_a_backend_fault_is_a_500_logged_once(server, caplog):
    url, _ = server
    with caplog.at_level(logging.ERROR, logger="zbrl.rollout.endpoint.server"):
        result = send(url, chat(messages=[{"role": "user", "content": "boom"}]))
    assert result[:2] == (500, "server_error") and "the backend broke" in result[2]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    still_answers(url)
