"""The dataset field each reward scores against, and its one parser.

A reward class names its field with an :class:`AnswerSpec` (``answer`` class attribute): the math
rewards use :data:`GT_ANSWER`, the code reward :data:`TEST_CASES`, a user reward the one its
config names. Rewards that need no answer (a learned or remote reward without a verifier, a user
reward with ``answer_field: none``, an environment that scores itself) use
:data:`OPTIONAL_GT_ANSWER`: open-ended prompts load without one, and a line that has one still
passes it on. The dataset loader checks every line with the spec's ``parse`` (so a bad line fails
at load time with its file and line), and the reward reads the same field at scoring time through
the same parser: ``test_cases`` has exactly one parser, :func:`parse_test_cases`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from zbrl.sandbox import parse_call_args

TEST_CASE_KEYS: tuple[str, ...] = ("inputs", "outputs", "fn_name")


class AnswerError(ValueError):
    """A bad answer field: ``problem`` says what is wrong, ``fix`` what to write instead."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}. Fix: {fix}")
        self.problem = problem
        self.fix = fix


@dataclass(frozen=True)
class AnswerSpec:
    """The example field a reward scores against."""

    field: str
    """Key of the field in a dataset line and in the example a reward receives."""
    needed_by: str
    """Who needs it, for error messages."""
    example_json: str
    """A correct JSON snippet of the field, for error messages."""
    parse: Callable[[Any], Any]
    """Raw value (never None) → the normalised value; raises :class:`AnswerError`."""
    required: bool = True
    """False: a line without the field is an open-ended prompt (its value is None)."""

    def needed_by_reward(self, who: str) -> AnswerSpec:
        """This spec with ``needed_by`` naming the configured reward (``who`` needs it)."""
        return replace(self, needed_by=f"{who} scores against it")

    def missing(self) -> AnswerError:
        others = [s.field for s in ANSWER_SPECS.values() if s.field != self.field]
        return AnswerError(
            f"'{self.field}' is missing; {self.needed_by}",
            f"add {self.example_json} to every line, or choose a reward that uses "
            + " or ".join(f"'{o}'" for o in others)
            + " or needs no answer (reward_model, llm_judge or http without a verifier, a user "
            "reward with answer_field: none)",
        )

    def read(self, row: Any) -> Any:
        """The parsed field of a dataset row or example (None when it is absent and not
        required); raises :class:`AnswerError`."""
        value = row.get(self.field) if isinstance(row, dict) else None
        if value is None:
            if not self.required:
                return None
            raise self.missing()
        return self.parse(value)


def parse_gt_answer(value: Any) -> str:
    """A gold answer: a non-empty string, or a finite number (returned as its string)."""
    if isinstance(value, bool):
        raise AnswerError(
            f"'gt_answer' must be a string or a number, got a boolean ({value})",
            'write the answer as a string, e.g. "gt_answer": "True"',
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise AnswerError(
            f"'gt_answer' is not a finite number ({value})",
            "write the answer as a string",
        )
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise AnswerError(
            f"'gt_answer' must be a string or a number, got {type_name(value)}",
            'write the final answer as one string, e.g. "gt_answer": "\\\\frac{1}{2}"',
        )
    if not value.strip():
        raise AnswerError(
            "'gt_answer' is empty",
            'give the reference final answer (a string such as "42")',
        )
    return value


def parse_test_cases(value: Any) -> dict[str, Any]:
    """``test_cases``: an object (or the JSON text of one) with ``inputs`` and ``outputs`` lists
    of strings of equal, non-zero length, and an optional ``fn_name``. With ``fn_name`` every
    input is the JSON of the call's arguments and every output the JSON of the return value.
    Returns ``{"inputs", "outputs"}`` plus ``"fn_name"`` when given (null means stdin/stdout).
    """
    fix = 'write "test_cases": {"inputs": ["<stdin>", ...], "outputs": ["<stdout>", ...]}'
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise AnswerError(
                f"'test_cases' is a string but not valid JSON ({exc.msg} at column {exc.colno})",
                fix + " as an object or as a JSON string of that object",
            ) from None
    if not isinstance(value, dict):
        raise AnswerError(f"'test_cases' must be an object, got {type_name(value)}", fix)
    unknown = sorted(str(k) for k in value if k not in TEST_CASE_KEYS)
    if unknown:
        raise AnswerError(
            f"'test_cases' has unknown key(s) {', '.join(map(repr, unknown))}",
            f"use only {', '.join(TEST_CASE_KEYS)}",
        )
    cases: dict[str, Any] = {key: _string_list(value, key, fix) for key in ("inputs", "outputs")}
    if not cases["inputs"]:
        raise AnswerError("'test_cases.inputs' is empty", "give at least one test case")
    if len(cases["inputs"]) != len(cases["outputs"]):
        raise AnswerError(
            f"'test_cases.inputs' has {len(cases['inputs'])} items but 'test_cases.outputs' has "
            f"{len(cases['outputs'])}",
            "give exactly one expected output per input",
        )
    fn_name = value.get("fn_name")
    if fn_name is not None:
        _check_call_cases(fn_name, cases)
        cases["fn_name"] = fn_name
    return cases


def _string_list(value: dict[str, Any], key: str, fix: str) -> list[str]:
    items = value.get(key)
    if items is None:
        raise AnswerError(f"'test_cases' has no '{key}' list", fix)
    if not isinstance(items, list):
        raise AnswerError(
            f"'test_cases.{key}' must be a list of strings, got {type_name(items)}", fix
        )
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise AnswerError(
                f"'test_cases.{key}[{i}]' must be a string, got {type_name(item)}",
                "write every input and expected output as a string (e.g. json.dumps "
                "non-string values)",
            )
    return list(items)


def _check_call_cases(fn_name: Any, cases: dict[str, Any]) -> None:
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise AnswerError(
            f"'test_cases.fn_name' must be a function name, got {fn_name!r}",
            "give the name of the function to call, or leave fn_name out (or null) for "
            "stdin/stdout programs",
        )
    for i, test_input in enumerate(cases["inputs"]):
        try:
            parse_call_args(test_input)
        except ValueError as exc:
            raise AnswerError(
                f"'test_cases.inputs[{i}]': {exc}",
                "with 'fn_name' each input is the JSON array of arguments (or one JSON value "
                "per line)",
            ) from None
    for i, output in enumerate(cases["outputs"]):
        try:
            json.loads(output)
        except ValueError:
            raise AnswerError(
                f"'test_cases.outputs[{i}]' is not JSON ({output[:60]!r})",
                "with 'fn_name' each output is the JSON of the return value, e.g. '6' or '\"abc\"'",
            ) from None


def type_name(value: Any) -> str:
    """A readable name of a JSON value's type, for error messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if type(value) in names:
        return names[type(value)]
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    return type(value).__name__


GT_ANSWER = AnswerSpec(
    field="gt_answer",
    needed_by="the math rewards (think_answer_tags, boxed) score against it",
    example_json='"gt_answer": "42"',
    parse=parse_gt_answer,
)
TEST_CASES = AnswerSpec(
    field="test_cases",
    needed_by="the code reward runs the program against it",
    example_json='"test_cases": {"inputs": ["1 2\\n"], "outputs": ["3\\n"]}',
    parse=parse_test_cases,
)
OPTIONAL_GT_ANSWER = replace(
    GT_ANSWER, needed_by="no reward needs it (open-ended prompts)", required=False
)
"""``gt_answer`` when a line has one (passed on to the reward), nothing when it has none."""
ANSWER_SPECS: dict[str, AnswerSpec] = {s.field: s for s in (GT_ANSWER, TEST_CASES)}
"""Every answer field a reward can score against, by field name."""
