"""The ``code`` reward: extraction, test-case parsing, scoring, and containment via the reward."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from zbrl.assembly.rewards import build_reward_fn
from zbrl.config import ConfigError, load_config
from zbrl.rewards import RewardContext, build_reward
from zbrl.rewards.code import CodeReward, extract_solution, parse_test_cases
from zbrl.sandbox import SandboxLimits, bubblewrap
from zbrl.sandbox.bubblewrap import BwrapProbe, SandboxUnavailableError

LIMITS = {"timeout_s": 1.0, "memory_mb": 256}
CTX = RewardContext(response_tokens=50, max_new_tokens=512)
EVAL = RewardContext(response_tokens=50, max_new_tokens=512, eval_mode=True)
ADD_CASES = {"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]}
ADD_EXAMPLE = {"messages": [{"role": "user", "content": "add"}], "test_cases": ADD_CASES}
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"


def fenced(code: str, before: str = "Here is my solution.\n") -> str:
    return f"{before}```python\n{code}```\nDone."


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return CodeReward(correct_reward=10.0, limits=LIMITS, max_workers=2)


# ------------------------------------------------------------------------------------------------
# Extraction and parsing
# ------------------------------------------------------------------------------------------------


def test_extract_solution_takes_the_last_python_fence() -> None:
    text = "```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```\ntrailing"
    solution = extract_solution(text)
    assert solution.code == "print(2)\n"
    assert solution.format_valid


def test_extract_solution_without_or_with_unclosed_fence_is_invalid_format() -> None:
    plain = extract_solution("print(3)")
    assert (plain.code, plain.format_valid) == ("print(3)", False)
    unclosed = extract_solution("text\n```python\nprint(4)\n")
    assert (unclosed.code, unclosed.format_valid) == ("print(4)\n", False)
    info = extract_solution("```python3\nprint(5)\n```")
    assert (info.code, info.format_valid) == ("print(5)\n", True)
    other_language = extract_solution("```\nprint(6)\n```")
    assert not other_language.format_valid


def test_parse_test_cases_accepts_object_and_json_string() -> None:
    parsed = parse_test_cases({"test_cases": ADD_CASES})
    assert [t.input for t in parsed.tests] == ["1 2\n", "10 -3\n"]
    assert parsed.fn_name is None
    as_string = parse_test_cases(
        {"test_cases": '{"inputs": ["[3]"], "outputs": ["6"], "fn_name": "double"}'}
    )
    assert as_string.fn_name == "double"
    assert as_string.tests[0].expected == "6"
    null_fn = parse_test_cases({"test_cases": {**ADD_CASES, "fn_name": None}})
    assert null_fn.fn_name is None


@pytest.mark.parametrize(
    ("test_cases", "message"),
    [
        (None, "no 'test_cases' field"),
        ("{not json", "'test_cases' is a string but not valid JSON"),
        (["1"], "'test_cases' must be an object"),
        ({"inputs": ["1"]}, "'test_cases' has no 'outputs' list"),
        ({"inputs": "1", "outputs": ["1"]}, "'test_cases.inputs' must be a list of strings"),
        ({"inputs": ["1", 2], "outputs": ["1", "2"]}, r"'test_cases.inputs\[1\]' must be a string"),
        ({"inputs": [], "outputs": []}, "'test_cases.inputs' is empty"),
        ({"inputs": ["1"], "outputs": ["1", "2"]}, "has 1 items but 'test_cases.outputs' has 2"),
        ({"inputs": ["1"], "outputs": ["1"], "extra": 1}, "unknown key"),
        ({"inputs": ["1"], "outputs": ["1"], "fn_name": "not a name"}, "'test_cases.fn_name'"),
        ({"inputs": ["[1]"], "outputs": ["abc"], "fn_name": "f"}, r"'test_cases.outputs\[0\]'"),
        ({"inputs": ["x y"], "outputs": ["1"], "fn_name": "f"}, r"'test_cases.inputs\[0\]'"),
    ],
)
def test_malformed_test_cases_raise_naming_the_field(test_cases: object, message: str) -> None:
    example = {} if test_cases is None else {"test_cases": test_cases}
    with pytest.raises(ValueError, match=message):
        parse_test_cases(example)


# ------------------------------------------------------------------------------------------------
# Scoring
# ------------------------------------------------------------------------------------------------


def test_registered_and_built_by_name() -> None:
    built = build_reward("code", correct_reward=2.0, limits=LIMITS)
    assert isinstance(built, CodeReward)
    assert built.name == "code"
    assert built.limits == SandboxLimits(**LIMITS)
    result = built.score(fenced(ADD), ADD_EXAMPLE, CTX)
    assert result.reward == 2.0


def test_correct_program_gets_full_reward(reward: CodeReward) -> None:
    result = reward.score(fenced(ADD), ADD_EXAMPLE, CTX)
    assert (result.reward, result.format_acc, result.ans_acc) == (10.0, 1.0, 1.0)
    assert result.parsed == ADD
    assert result.metadata["pass_fraction"] == 1.0
    assert result.metadata["test_statuses"] == ["pass", "pass"]
    assert result.metadata["reason"] == "correct"


def test_wrong_program_gets_nothing(reward: CodeReward) -> None:
    result = reward.score(fenced("print(3)\n"), ADD_EXAMPLE, CTX)
    assert (result.reward, result.format_acc, result.ans_acc) == (0.0, 1.0, 0.0)
    assert result.metadata["pass_fraction"] == 0.5
    assert result.metadata["test_statuses"] == ["pass", "wrong_answer"]
    assert result.metadata["reason"].startswith("test 1: wrong_answer")


def test_syntax_error_gets_nothing(reward: CodeReward) -> None:
    result = reward.score(fenced("def broken(:\n"), ADD_EXAMPLE, CTX)
    assert (result.reward, result.ans_acc) == (0.0, 0.0)
    assert result.metadata["test_statuses"] == ["runtime_error", "runtime_error"]


def test_partial_credit_gives_the_pass_fraction() -> None:
    partial = CodeReward(correct_reward=10.0, partial_credit=True, limits=LIMITS)
    result = partial.score(fenced("print(3)\n"), ADD_EXAMPLE, CTX)
    assert result.reward == pytest.approx(5.0)
    assert result.ans_acc == 0.0


def test_format_gates_the_reward_in_training_but_not_in_eval(reward: CodeReward) -> None:
    training = reward.score(ADD, ADD_EXAMPLE, CTX)
    assert (training.reward, training.format_acc, training.ans_acc) == (0.0, 0.0, 1.0)
    assert training.metadata["reason"] == "bad_format"
    evaluation = reward.score(ADD, ADD_EXAMPLE, EVAL)
    assert (evaluation.reward, evaluation.format_acc, evaluation.ans_acc) == (10.0, 0.0, 1.0)


def test_function_call_examples(reward: CodeReward) -> None:
    example = {
        "test_cases": '{"inputs": ["[3]", "[5]"], "outputs": ["6", "10"], "fn_name": "double"}'
    }
    good = reward.score(fenced("def double(x):\n    return 2 * x\n"), example, CTX)
    assert (good.reward, good.ans_acc) == (10.0, 1.0)
    leetcode = {
        "test_cases": {"inputs": ["[[1, 2, 3]]"], "outputs": ["[3, 2, 1]"], "fn_name": "rev"}
    }
    method = "class Solution:\n    def rev(self, xs):\n        return xs[::-1]\n"
    assert reward.score(fenced(method), leetcode, CTX).ans_acc == 1.0
    wrong = reward.score(fenced("def double(x):\n    return x\n"), example, CTX)
    assert (wrong.reward, wrong.ans_acc) == (0.0, 0.0)


def test_length_shaping_is_added_in_training_only() -> None:
    shaped = CodeReward(
        correct_reward=1.0,
        limits=LIMITS,
        length_shaping={"max_new_tokens": 100, "cache_length": 50, "max_penalty": 1.0},
    )
    long_ctx = RewardContext(response_tokens=75, max_new_tokens=100)
    assert shaped.score(fenced(ADD), ADD_EXAMPLE, long_ctx).reward == pytest.approx(0.5)
    long_eval = RewardContext(response_tokens=75, max_new_tokens=100, eval_mode=True)
    assert shaped.score(fenced(ADD), ADD_EXAMPLE, long_eval).reward == 1.0


def test_bad_options_are_rejected() -> None:
    with pytest.raises(TypeError, match="correct_reward"):
        CodeReward(correct_reward="10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_workers"):
        CodeReward(max_workers=0)
    with pytest.raises(TypeError, match="limits"):
        CodeReward(limits=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="score_batch got 2 responses"):
        CodeReward().score_batch(["a", "b"], [ADD_EXAMPLE], [CTX])


# ------------------------------------------------------------------------------------------------
# Containment through the reward (one batch, run in parallel)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["rlimits", "bwrap"])
def test_hostile_batch_is_contained_and_scored_zero(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "bwrap" and not bubblewrap.probe_bwrap().works:
        if os.environ.get("ZBRL_REQUIRE_BWRAP") == "1":
            pytest.fail(f"ZBRL_REQUIRE_BWRAP=1: {bubblewrap.probe_bwrap().error}")
        pytest.skip(f"bubblewrap does not work here: {bubblewrap.probe_bwrap().error}")
    reward = CodeReward(correct_reward=10.0, limits={**LIMITS, "backend": backend}, max_workers=2)
    assert reward.backend == backend
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("ZBRL_SECRET", secret)
    # in the checkout: outside the working directory of both backends (bwrap's is its own /tmp)
    escape = str(Path(__file__).resolve().parent / f"zbrl_escape_{uuid.uuid4().hex}")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    hostile = {
        "loop": "while True:\n    pass\n",
        "fork_bomb": "import os\nwhile True:\n    os.fork()\n",
        "allocation": "x = bytearray(50 * 1024 ** 3)\n",
        "output": "while True:\n    print('spam' * 100)\n",
        # The next three solve the task correctly once their hostile step has "worked", so only
        # containment makes them fail.
        "escape": f"open({escape!r}, 'w').write('x')\n{ADD}",
        "environment": (
            "import os\n"
            "a, b = map(int, input().split())\n"
            f"print(a + b if {secret!r} in repr(dict(os.environ)) else 'clean')\n"
        ),
        "network": (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n{ADD}"
        ),
    }
    expected_status = {
        "loop": {"timeout"},
        "fork_bomb": {"runtime_error"},
        "allocation": {"memory"},
        "output": {"output_limit"},
        "escape": {"runtime_error"},
        "environment": {"wrong_answer"},
        "network": {"runtime_error"},
    }
    names = list(hostile)
    responses = [fenced(hostile[n]) for n in names] + [fenced(ADD)]
    try:
        results = reward.score_batch(
            responses, [ADD_EXAMPLE] * len(responses), [CTX] * len(responses)
        )
        listener.settimeout(0.3)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    for name, result in zip(names, results):
        assert result.reward == 0.0, name
        assert result.ans_acc == 0.0, name
        assert result.metadata["test_statuses"][0] in expected_status[name], (name, result)
    assert not os.path.exists(escape)
    # The calling process is unharmed: the last, correct response in the same batch scored full
    # marks, and the reward keeps working afterwards.
    assert results[-1].reward == 10.0
    assert reward.score(fenced(ADD), ADD_EXAMPLE, CTX).reward == 10.0
    assert os.environ["ZBRL_SECRET"] == secret


# ------------------------------------------------------------------------------------------------
# The sandbox backend setting
# ------------------------------------------------------------------------------------------------


def test_backend_setting_reaches_the_reward() -> None:
    overrides = ["reward.type=code", "reward.sandbox.backend=rlimits"]
    reward = build_reward_fn(load_config("recipes/demo.yaml", overrides))
    assert (reward.limits.backend, reward.backend) == ("rlimits", "rlimits")
    default = load_config("recipes/demo.yaml", ["reward.type=code"])
    assert default.reward.sandbox.backend == "auto"
    with pytest.raises(ConfigError, match=r"reward\.sandbox\.backend"):
        load_config("recipes/demo.yaml", ["reward.type=code", "reward.sandbox.backend=docker"])


def test_bwrap_backend_without_bubblewrap_fails_when_the_reward_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = BwrapProbe(path=None, error="bwrap is not installed (not found on PATH)")
    monkeypatch.setattr(bubblewrap, "probe_bwrap", lambda: missing)
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        CodeReward(limits={**LIMITS, "backend": "bwrap"})
    overrides = ["reward.type=code", "reward.sandbox.backend=bwrap"]
    with pytest.raises(SandboxUnavailableError, match=r"reward\.sandbox\.backend=rlimits"):
        build_reward_fn(load_config("recipes/demo.yaml", overrides))


def test_a_sandbox_that_fails_to_start_is_a_failure_not_a_wrong_answer(
    reward: CodeReward, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The program's own failures are scores; the sandbox's are not (issue 30)."""
    import math

    from zbrl.sandbox import execution

    def no_process(*args: object, **kwargs: object) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(execution.subprocess, "Popen", no_process)
    result = reward.score(fenced(ADD), ADD_EXAMPLE, CTX)
    assert result.failed and math.isnan(result.reward)
    assert "cannot start the sandbox" in result.metadata["reward_error"]
    assert result.metadata["test_statuses"] == ["sandbox_error", "sandbox_error"]
