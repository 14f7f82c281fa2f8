"""The ``code`` reward: run the response's Python program against the example's test cases.

The program is the text after the last ```` ```python ```` fence up to the next ```` ``` ````.
A response without a closed fence has invalid format; its whole text (or, for an unclosed fence,
everything after it) is still run, so that ``ans_acc`` is measured, but in training the reward is
only given to well-formatted responses. Programs run in the local sandbox
(:mod:`zbrl.sandbox`: bubblewrap namespaces when they work here, else rlimits; see
``docs/sandbox.md``), many at a time in ``score_batch``.

``test_cases`` (an object or a JSON string of one, as in ``docs/datasets.md``)::

    {"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}                   stdin/stdout programs
    {"inputs": ["[3]", ...], "outputs": ["6", ...], "fn_name": "double"}      function calls

In function-call mode every input is the JSON array of positional arguments (or one JSON value per
line, one argument each) and every output is the JSON of the expected return value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zbrl.rewards.answers import TEST_CASES, AnswerError
from zbrl.rewards.base import (
    BaseReward,
    Example,
    RewardBatch,
    RewardContext,
    RewardResult,
    failed_result,
)
from zbrl.rewards.length import LengthShaping, as_length_shaping, training_penalty
from zbrl.rewards.registry import register_reward
from zbrl.sandbox import ProgramResult, SandboxLimits, TestCase, check_backend, run_programs

FENCE = "```python"
CLOSE = "```"


@dataclass(frozen=True)
class Solution:
    """The program extracted from a response."""

    code: str
    format_valid: bool


def extract_solution(response: str) -> Solution:
    """The code after the last ```` ```python ```` fence up to the next ```` ``` ````.

    Format is valid only when such a fence exists and is closed. Without a fence the whole text is
    the program; with an unclosed fence, everything after the fence line.
    """
    start = response.rfind(FENCE)
    if start < 0:
        return Solution(code=response, format_valid=False)
    line_end = response.find("\n", start)
    if line_end < 0:
        return Solution(code="", format_valid=False)
    body = response[line_end + 1 :]
    end = body.find(CLOSE)
    if end < 0:
        return Solution(code=body, format_valid=False)
    return Solution(code=body[:end], format_valid=True)


@dataclass(frozen=True)
class CodeTests:
    """Parsed ``test_cases`` of one example."""

    tests: list[TestCase]
    fn_name: str | None


def parse_test_cases(example: Example) -> CodeTests:
    """Read and check ``example["test_cases"]`` with the one ``test_cases`` parser
    (:func:`zbrl.rewards.answers.parse_test_cases`, the same the dataset loader uses)."""
    value = example.get("test_cases") if isinstance(example, Mapping) else None
    if value is None:
        raise ValueError(
            "code reward: the example has no 'test_cases' field; add "
            '"test_cases": {"inputs": ["1 2\\n"], "outputs": ["3\\n"]} (see docs/datasets.md)'
        )
    try:
        cases = TEST_CASES.parse(value)
    except AnswerError as exc:
        raise ValueError(f"code reward: {exc}") from None
    tests = [TestCase(input=i, expected=o) for i, o in zip(cases["inputs"], cases["outputs"])]
    return CodeTests(tests=tests, fn_name=cases.get("fn_name"))


@register_reward("code")
class CodeReward(BaseReward):
    """Score = test credit (gated by format in training) + length penalty.

    * test credit: ``correct_reward`` when every test passes (``partial_credit``: ``correct_reward``
      × the fraction of tests passed), given only when the format is valid or ``ctx.eval_mode``;
    * ``length_shaping.penalty(...)`` is added to every response in training (not in eval), as in
      the math rewards.

    ``format_acc`` is 1.0 for a closed ```` ```python ```` fence; ``ans_acc`` is 1.0 when all tests
    pass, else 0.0 (the program is run whatever its format). ``metadata`` holds ``format_valid``,
    ``pass_fraction``, ``test_statuses``, ``test_passed``, ``test_durations_s``,
    ``length_penalty`` and ``reason`` (``"correct"``, ``"bad_format"`` or the first failing test
    and why).

    Where the line between a score and a failure lies: whatever the candidate program does (a
    wrong answer, a crash, a timeout, a memory or output limit) is a score; a test whose status is
    ``sandbox_error`` (the sandbox could not start, did not start in time, or its runner died
    before reporting) says nothing about the program, so the response gets
    :func:`~zbrl.rewards.base.failed_result` and its group is not trained.
    """

    name = "code"
    answer = TEST_CASES
    """Scores against ``test_cases``."""
    system_prompt = (
        "You are an expert Python programmer. Solve the problem with a complete Python 3 program. "
        "Unless the problem names a function to write, read the input from standard input and "
        "print the answer to standard output. Put the whole solution in one ```python code block "
        "at the end of your reply."
    )
    """The default system prompt: the format this reward checks."""

    def __init__(
        self,
        *,
        correct_reward: float = 1.0,
        partial_credit: bool = False,
        limits: SandboxLimits | Mapping[str, Any] | None = None,
        max_workers: int = 2,
        length_shaping: LengthShaping | Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(correct_reward, bool) or not isinstance(correct_reward, (int, float)):
            raise TypeError(f"code: correct_reward must be a number, got {correct_reward!r}")
        if not math.isfinite(correct_reward) or correct_reward < 0:
            raise ValueError(f"code: correct_reward must be finite and >= 0, got {correct_reward}")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"code: max_workers must be an int >= 1, got {max_workers!r}")
        if isinstance(limits, Mapping):
            limits = SandboxLimits(**limits)
        if limits is not None and not isinstance(limits, SandboxLimits):
            raise TypeError(
                f"code: limits must be a SandboxLimits, a dict of its fields or None, got "
                f"{type(limits).__name__}"
            )
        self.correct_reward = float(correct_reward)
        self.partial_credit = bool(partial_credit)
        self.limits = limits or SandboxLimits()
        self.backend = check_backend(self.limits)
        """The sandbox backend programs run under (``auto`` resolved: an unusable ``bwrap``
        fails here, at build time, not at the first score)."""
        self.max_workers = max_workers
        self.length_shaping = as_length_shaping(length_shaping, "code")

    def score_responses(self, batch: RewardBatch) -> list[RewardResult]:
        responses, examples, contexts = batch
        solutions = [extract_solution(r) for r in responses]
        parsed = [parse_test_cases(e) for e in examples]
        candidates = [(s.code, p.tests, p.fn_name) for s, p in zip(solutions, parsed)]
        programs = run_programs(candidates, self.limits, max_workers=self.max_workers)
        return [self._result(s, p, c) for s, p, c in zip(solutions, programs, contexts)]

    def _result(
        self, solution: Solution, program: ProgramResult, ctx: RewardContext
    ) -> RewardResult:
        broken = [t for t in program.tests if t.status == "sandbox_error"]
        if broken:  # the sandbox failed, not the program: no score (never a wrong answer)
            return failed_result(
                f"sandbox failure: {broken[0].detail or 'sandbox_error'}",
                format_acc=1.0 if solution.format_valid else 0.0,
                metadata={"test_statuses": program.statuses, "format_valid": solution.format_valid},
            )
        all_passed = program.all_passed
        credit = program.pass_fraction if self.partial_credit else float(all_passed)
        gated = solution.format_valid or ctx.eval_mode
        penalty = training_penalty(self.length_shaping, ctx)
        reward = (self.correct_reward * credit if gated else 0.0) + penalty
        if not gated:
            reason = "bad_format"
        elif all_passed:
            reason = "correct"
        else:
            reason = _first_failure(program)
        return RewardResult(
            reward=reward,
            format_acc=1.0 if solution.format_valid else 0.0,
            ans_acc=1.0 if all_passed else 0.0,
            parsed=solution.code,
            metadata={
                "format_valid": solution.format_valid,
                "pass_fraction": program.pass_fraction,
                "test_statuses": program.statuses,
                "test_passed": program.passed,
                "test_durations_s": [round(t.duration_s, 4) for t in program.tests],
                "length_penalty": penalty,
                "reason": reason,
            },
        )


def _first_failure(program: ProgramResult) -> str:
    for i, test in enumerate(program.tests):
        if not test.passed:
            reason = test.detail
            if not reason and test.stderr_tail.strip():
                reason = test.stderr_tail.strip().splitlines()[-1]
            return f"test {i}: {test.status}" + (f" ({reason})" if reason else "")
    return "correct"
