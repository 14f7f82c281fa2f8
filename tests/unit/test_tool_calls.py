"""Tool calls: both formats parsed, the calculator, and hostile calls answered (never raised)."""

import time

import pytest

from zbrl.environments.calculator import CalculatorError, calculate
from zbrl.environments.tool_calls import MalformedCall, ToolCall, parse_hermes, parse_tags
from zbrl.environments.tool_env import ToolEnvironment, ToolSettings
from zbrl.environments.tools import Calculator, SandboxedPython, ToolError, call_tool


def settings(**kw):
    base = dict(
        call_format="hermes",
        on_error="reply",
        max_result_chars=200,
        tool_timeout_s=2.0,
        stop_after_call=False,
    )
    return ToolSettings(**{**base, **kw})


def test_hermes_calls_in_order_with_string_arguments():
    text = (
        'a <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call> b '
        '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n</tool_call>'
    )
    assert parse_hermes(text) == [
        ToolCall("calculator", {"expression": "1+2"}),
        ToolCall("python", {"code": "print(1)"}),
    ]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"name": "calculator", "arguments": {', "not valid JSON"),
        ('["calculator"]', 'string "name"'),
        ('{"name": "calculator", "arguments": [1]}', '"arguments" must be a JSON object'),
    ],
)
def test_hermes_malformed_bodies(body, reason):
    (call,) = parse_hermes(f"<tool_call>{body}</tool_call>")
    assert isinstance(call, MalformedCall) and reason in call.reason


def test_unclosed_calls_are_malformed():
    (call,) = parse_hermes('<tool_call>{"name": "x"}')
    assert isinstance(call, MalformedCall) and "never closed" in call.reason
    (call,) = parse_tags("<calc>1+2", {"calc": ("calculator", "expression")})
    assert isinstance(call, MalformedCall) and "never closed" in call.reason


def test_tags_fill_the_tools_argument():
    tags = {"calc": ("calculator", "expression"), "python": ("python", "code")}
    assert parse_tags("x<calc>12*34</calc>y<python>print(2)</python><other>1</other>", tags) == [
        ToolCall("calculator", {"expression": "12*34"}),
        ToolCall("python", {"code": "print(2)"}),
    ]
    assert parse_tags("no calls here", tags) == []


@pytest.mark.parametrize(
    ("expr", "value"),
    [("123*456", "56088"), ("7/2", "3.5"), ("(1+2)**3", "27"), ("-5//2", "-3"), ("3.0*2", "6")],
)
def test_calculator_values(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ('__import__("os").system("true")', "not Call"),
        ("x + 1", "not Name"),
        ("1/0", "division by zero"),
        ("2**65", "exponent"),
        ("9" * 99 + "**64", "longer than 100 digits"),
        ("1e308*10", "finite"),
        ("", "empty"),
        ("1 +", "cannot parse"),
    ],
)
def test_calculator_refuses(expr, message):
    with pytest.raises(CalculatorError, match=message):
        calculate(expr)


def test_call_tool_turns_failures_into_messages():
    class Crashes:
        name, tag, argument = "boom", "boom", "x"

        def call(self, arguments):
            raise KeyError("inside the tool")

    class Hangs:
        name, tag, argument = "slow", "slow", "x"

        def call(self, arguments):
            time.sleep(1.0)
            return "late"

    assert call_tool(Calculator(), {"expression": "2*3"}, 1.0).text == "6"
    bad = call_tool(Calculator(), {"expr": "2*3"}, 1.0)
    assert bad.status == "error" and 'argument "expression"' in bad.text
    crash = call_tool(Crashes(), {}, 1.0)
    assert crash.status == "crash" and "KeyError" in crash.text
    t0 = time.monotonic()
    hung = call_tool(Hangs(), {}, 0.1)
    assert hung.status == "timeout" and time.monotonic() - t0 < 0.8


def test_hostile_calls_are_answered_and_counted():
    env = ToolEnvironment([Calculator()], settings())
    episode = env.start({})
    turn = episode.step(
        '<tool_call>{"name": "calculator", "arguments": {bad json}}</tool_call>'
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    )
    assert turn.counts == {
        "tool_calls": 3,
        "malformed_calls": 1,
        "unknown_tools": 1,
        "tool_errors": 2,
    }
    responses = turn.message.split("</tool_response>")
    assert "malformed tool call" in responses[0]
    assert "unknown tool 'rm_rf' (tools: calculator)" in responses[1]
    assert "<tool_response>\n42\n" in responses[2]
    assert [c["status"] for c in turn.info["tool_calls"]] == ["error", "error", "ok"]


def test_on_error_end_ends_the_episode():
    env = ToolEnvironment([Calculator()], settings(on_error="end", call_format="tags"))
    turn = env.start({}).step("<calc>1/0</calc>")
    assert turn.message is None and turn.counts["tool_failures"] == 1
    assert env.start({}).step("no call: the answer is 3").message is None


def test_long_results_are_cut():
    class Loud:
        name, tag, argument = "loud", "loud", "x"

        def call(self, arguments):
            return "y" * 10_000

    env = ToolEnvironment([Loud()], settings(call_format="tags", max_result_chars=50))
    turn = env.start({}).step("<loud>go</loud>")
    assert turn.message == "y" * 50 + "\n[cut: 9950 more characters]"
    assert turn.counts == {"tool_calls": 1, "results_cut": 1}


def test_stop_strings_close_calls():
    tags = ToolEnvironment([Calculator()], settings(call_format="tags", stop_after_call=True))
    assert tags.stop_strings == ("</calc>",)
    hermes = ToolEnvironment([Calculator()], settings(stop_after_call=True))
    assert hermes.stop_strings == ("</tool_call>",)
    assert not hasattr(ToolEnvironment([Calculator()], settings()), "stop_strings")


def python_env(timeout_s):
    return ToolEnvironment(
        [SandboxedPython(timeout_s=timeout_s, memory_mb=256, backend="rlimits")],
        settings(call_format="tags", tool_timeout_s=timeout_s, max_result_chars=100),
    )


def test_python_tool_hostile_programs():
    """An infinite loop is stopped at the deadline; a huge output comes back cut; a crash
    comes back with its error — each as a message, in the sandbox."""
    t0 = time.monotonic()
    loop = python_env(0.5).start({}).step("<python>while True:\n    pass</python>")
    assert time.monotonic() - t0 < 10
    assert loop.counts["tool_timeouts"] == 1 and "stopped" in loop.message
    episode = python_env(10.0).start({})  # generous: these programs end by themselves
    huge = episode.step("<python>print('z' * 10**6)</python>")
    assert huge.counts.get("results_cut") == 1 and huge.message.startswith("z" * 100 + "\n[cut:")
    crash = episode.step("<python>print(1)\nraise ValueError('bad')</python>")
    assert crash.counts["tool_failures"] == 1 and "ValueError: bad" in crash.message
    ok = episode.step("<python>print(123 * 456)</python>")
    assert ok.message == "56088" and ok.counts == {"tool_calls": 1}


def test_python_tool_rejects_missing_code():
    with pytest.raises(ToolError, match='"code"'):
        SandboxedPython().call({"program": "print(1)"})
