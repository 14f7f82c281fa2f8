"""``zbrl serve``: the endpoint over a model directory answers an ``openai`` client."""

import openai
import pytest

from zbrl.cli import build_parser
from zbrl.config import load_config
from zbrl.evaluation.serve import start_serving
from zbrl.rollout.endpoint.server import EndpointSettings


def test_serve_answers_an_openai_client(tiny_model_dir):
    settings = EndpointSettings("127.0.0.1", 0, 0.01, 8, 60.0)
    serving = start_serving(
        load_config(None), tiny_model_dir, settings, temperature=0.0, max_tokens=5
    )
    try:
        client = openai.OpenAI(base_url=serving.endpoint.base_url, api_key="any", max_retries=0)
        assert [m.id for m in client.models.list().data] == [tiny_model_dir.name]
        messages = [{"role": "user", "content": "1+2"}]
        first = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        again = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
        assert first.choices[0].message.role == "assistant"
        assert 1 <= first.usage.completion_tokens <= 4 and first.usage.prompt_tokens > 3
        # greedy: the same answer to the same question, each request a conversation of its own
        assert again.choices[0].message.content == first.choices[0].message.content
        text = client.completions.create(model="m", prompt="12", max_tokens=3)
        assert text.usage.completion_tokens <= 3
        chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert streamed == first.choices[0].message.content  # greedy: the same answer, streamed
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        response = client.responses.create(model="m", input="1+2", max_output_tokens=4)
        assert response.output_text == first.choices[0].message.content
        assert 1 <= response.usage.output_tokens <= 4
    finally:
        serving.stop()


def test_serve_command_line():
    args = build_parser().parse_args(["serve", "ckpt", "--port", "0", "--max-tokens", "16"])
    assert (args.model, args.port, args.max_tokens, args.host) == ("ckpt", 0, 16, "127.0.0.1")


def test_serve_refuses_an_open_host_without_a_key_before_binding(monkeypatch, capsys):
    from zbrl.cli import main

    monkeypatch.delenv("ZBRL_API_KEY", raising=False)
    # nothing is loaded nor bound: the model path need not even exist
    assert main(["serve", "/nonexistent", "--host", "0.0.0.0", "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: zbrl serve --host 0.0.0.0 is not loopback and has no API key")
    assert "--api-key" in err and "--allow-anyone" in err


def test_serve_access_rules(monkeypatch):
    from zbrl.errors import RunError
    from zbrl.evaluation.serve_access import check_access, is_loopback, serve_api_key

    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "localhost")] == [True] * 4
    assert [is_loopback(h) for h in ("0.0.0.0", "10.0.0.5", "::", "example.org")] == [False] * 4
    assert check_access("127.0.0.1", None, False) is None
    assert check_access("0.0.0.0", "k", False) is None
    with pytest.raises(RunError, match="not loopback and has no API key"):
        check_access("::", None, False)
    assert "without an API key" in check_access("0.0.0.0", None, True)
    monkeypatch.setenv("ZBRL_API_KEY", "from-env")
    assert serve_api_key(None) == "from-env" and serve_api_key("given") == "given"
    monkeypatch.setenv("ZBRL_API_KEY", "")
    assert serve_api_key(None) is None
