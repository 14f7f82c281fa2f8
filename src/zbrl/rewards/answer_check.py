"""Is a predicted final answer equivalent to the gold one?

:func:`answers_equivalent` compares with ``math_verify`` (symbolic: ``\\frac{1}{2}`` = ``0.5`` =
``1/2``, sets, intervals, ...) and falls back to a normalised string match. It never raises on a
bad prediction: a parse failure, a timeout or a crash of math_verify gives no verdict, and the
string match alone decides. A bad *gold* answer (empty or not a string) raises ``ValueError``:
that is a dataset problem.

Protection against pathological inputs (math_verify calls sympy, which can run for ever on
``9^{9^{9}}`` or deeply nested braces, holding the GIL):

* math_verify's own timeouts use ``signal.alarm``, which only works in the main thread, so they are
  disabled (``parsing_timeout=None``, ``timeout_seconds=None``) and scoring works from any thread;
* a static guard skips math_verify (string match only) for answers longer than
  :data:`MAX_ANSWER_CHARS` characters, nested deeper than :data:`MAX_NESTING_DEPTH` brackets,
  with an exponent inside an exponent, a huge integer exponent or a huge factorial;
* with ``timeout_s`` set (the default) the math_verify step runs in a worker process of a small
  pool and is abandoned, the worker killed, after ``timeout_s`` seconds
  (:func:`~zbrl.rewards.deadline.run_many_with_deadline`, one round trip per batch:
  :func:`answers_equivalent_many`). ``timeout_s=None`` runs in-process: faster, no hard deadline.

The deadline pool lives in :mod:`zbrl.rewards.deadline`; the scoring rule shared by the math
rewards in :mod:`zbrl.rewards.math_reward`.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zbrl.rewards.deadline import (
    DEFAULT_TIMEOUT_S,
    DeadlineExceeded,
    Failed,
    WorkerCrashed,
    run_many_with_deadline,
)

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 256
"""Answers longer than this are compared by string only (math_verify parse time grows quickly)."""
MAX_NESTING_DEPTH = 8
"""Answers with more nested brackets are compared by string only (parse time is exponential)."""
_MAX_EXPONENT_DIGITS = 4
_MAX_FACTORIAL_DIGITS = 5

MatchMethod = str
"""``"math_verify"``, ``"string"`` or ``"none"``: what decided the comparison."""


# --------------------------------------------------------------------------------------------
# Text normalisation


def _unicode_table() -> dict[int, str]:
    table = {0xFF01 + i: chr(0x21 + i) for i in range(0x5E)}  # full-width ASCII forms
    for minus in (0x2212, 0xFE63, 0x2796):  # minus sign, small minus, heavy minus
        table[minus] = "-"
    for space in (0x00A0, 0x2007, 0x2009, 0x202F, 0x3000):  # no-break, figure, thin, ideographic
        table[space] = " "
    return table


_UNICODE_TABLE = _unicode_table()
_LATEX_NOISE = re.compile(r"\\(?:left|right|displaystyle|!|,|;|:|\s)")
_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|operatorname)\s*(?=\{)")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac\b")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def fold_unicode(text: str) -> str:
    """Map full-width ASCII forms to ASCII, unicode minus signs to ``-``, odd spaces to ``' '``."""
    return text.translate(_UNICODE_TABLE)


def normalize_answer(text: str) -> str:
    """The string-match form of an answer.

    Folds unicode (see :func:`fold_unicode`), strips ``$...$``, a whole-answer ``\\boxed{}``,
    ``\\left``/``\\right`` and spacing commands, ``\\text``-like command names (keeping their
    content), all whitespace, trailing periods, thousands-separator commas (only in a number
    such as ``1,234,567.5``), braces (``{}``, ``\\{\\}``); then case-folds. ``\\dfrac`` and
    ``\\tfrac`` become ``\\frac``.
    """
    s = fold_unicode(text).strip().rstrip(".").rstrip()
    while len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s[1:-1].strip()
    boxed = _whole_boxed_content(s)
    if boxed is not None:
        s = boxed
    s = _LATEX_NOISE.sub("", s)
    s = _TEXT_COMMANDS.sub("", s)
    s = _FRAC_VARIANTS.sub(r"\\frac", s)
    s = "".join(s.split())
    s = s.rstrip(".")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = s.replace("\\{", "").replace("\\}", "").replace("{", "").replace("}", "")
    return s.casefold()


def _whole_boxed_content(s: str) -> str | None:
    """``X`` when ``s`` is exactly ``\\boxed{X}``."""
    if not s.startswith("\\boxed{") or not s.endswith("}"):
        return None
    end = match_brace(s, len("\\boxed"))
    return s[len("\\boxed{") : end] if end == len(s) - 1 else None


def match_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_index``, or None when it never closes.

    Escaped braces (``\\{``, ``\\}``) do not count.
    """
    depth = 0
    i = open_index
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


# --------------------------------------------------------------------------------------------
# Static guard


_OPEN = "([{"
_CLOSE = ")]}"
_EXPONENT = re.compile(r"\^|\*\*")
_TOKEN = re.compile(r"\\?[\w.]*")
_FACTORIAL = re.compile(r"(\d+)\s*!")


def unsafe_reason(text: str) -> str | None:
    """Why ``text`` should not be given to math_verify (None when it may be)."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    depth = max_depth = 0
    for ch in text:
        if ch in _OPEN:
            depth += 1
            max_depth = max(max_depth, depth)
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
    if max_depth > MAX_NESTING_DEPTH:
        return f"nested deeper than {MAX_NESTING_DEPTH} brackets"
    for m in _EXPONENT.finditer(text):
        operand, rest = _exponent_operand(text, m.end())
        if _EXPONENT.search(operand) or _EXPONENT.match(rest.lstrip()):
            return "an exponent inside an exponent"
        digits = operand.strip("{}() ").lstrip("+-")
        if digits.isdigit() and len(digits) > _MAX_EXPONENT_DIGITS:
            return f"an integer exponent with more than {_MAX_EXPONENT_DIGITS} digits"
    for m in _FACTORIAL.finditer(text):
        if len(m.group(1)) > _MAX_FACTORIAL_DIGITS:
            return f"a factorial of a number with more than {_MAX_FACTORIAL_DIGITS} digits"
    return None


def _exponent_operand(text: str, start: int) -> tuple[str, str]:
    """Split ``text[start:]`` into the exponent operand (a group or a token) and the rest."""
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text) and text[i] in _OPEN:
        depth = 0
        for j in range(i, len(text)):
            if text[j] in _OPEN:
                depth += 1
            elif text[j] in _CLOSE:
                depth -= 1
                if depth == 0:
                    return text[i : j + 1], text[j + 1 :]
        return text[i:], ""
    m = _TOKEN.match(text, i)
    end = m.end() if m else i
    return text[i:end], text[end:]


# --------------------------------------------------------------------------------------------
# math_verify


class _DropTimeoutDisabledWarning(logging.Filter):
    """math_verify warns once that its timeout is off; zbrl enforces its own deadline."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


@functools.lru_cache(maxsize=1)
def _math_verify() -> tuple[Any, Any, list[Any]]:
    """Import math_verify lazily (it pulls in sympy) and build the extraction config."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # math_verify's default LaTeX normalisation (basic LaTeX, units, malformed operators, nits,
    # all boxes), so what math_verify accepts by default is accepted here: \frac12 = 0.5,
    # \sqrt3/2 = \frac{\sqrt3}{2}. The seed turned malformed_operators and nits off, which
    # made such answers wrong or misread them (\frac 1 2 parsed as 2, \sqrt 3 as 3).
    config = [ExprExtractionConfig(), LatexExtractionConfig(boxed_match_priority=0)]
    return parse, verify, config


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[Any, ...]:
    parse, _, config = _math_verify()
    boxed = text if "\\boxed" in text else "\\boxed{" + text + "}"
    try:
        return tuple(parse(boxed, extraction_config=config, parsing_timeout=None))
    except Exception:  # math_verify catches most errors itself; anything left is a parse failure
        return ()


def math_verify_equal(pred: str, gold: str) -> bool | None:
    """math_verify's verdict on two (guarded) answers; None when either could not be parsed.

    Runs without math_verify's signal-based timeouts: call it through :func:`run_with_deadline`
    when the inputs are untrusted.
    """
    gold_parsed = _parse(gold)
    pred_parsed = _parse(pred)
    if not gold_parsed or not pred_parsed:
        return None
    _, verify, _ = _math_verify()
    try:
        return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None))
    except Exception:
        return False


def warm_up() -> None:
    """Import math_verify and run one comparison (sympy initialises lazily: ~0.5 s once)."""
    math_verify_equal("1/2", "0.5")


# --------------------------------------------------------------------------------------------
# The comparison


def check_gold(gold: object, *, field: str = "gt_answer") -> str:
    """Return the gold answer, or raise ``ValueError`` naming the dataset problem."""
    if not isinstance(gold, str):
        raise ValueError(
            f"the gold answer {field!r} must be a non-empty string, got {type(gold).__name__} "
            f"{gold!r:.80}; fix the dataset row (write the answer as a JSON string)"
        )
    if not gold.strip():
        raise ValueError(
            f"the gold answer {field!r} is empty; fix the dataset row (every math example needs "
            f"its final answer)"
        )
    return gold


def answers_equivalent(
    pred: str | None, gold: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S
) -> tuple[bool, MatchMethod]:
    """Whether ``pred`` is equivalent to ``gold``, and what decided it.

    ``method`` is ``"math_verify"`` when math_verify judged (correct, or both parsed and found
    different), ``"string"`` when the normalised string match decided (it is tried whenever
    math_verify does not say "equal": unparsable, guarded, timed out or different), and ``"none"``
    when there was nothing to compare (``pred`` None or blank).

    Both sides are wrapped in ``\\boxed{}`` unless already boxed and parsed with LaTeX and plain
    expression extraction. ``timeout_s`` is the hard deadline of the math_verify step, run in a
    worker process; None runs it in this process (no hard deadline, the static guard only).
    """
    return answers_equivalent_many([(pred, gold)], timeout_s=timeout_s)[0]


def answers_equivalent_many(
    pairs: Sequence[tuple[str | None, str]], *, timeout_s: float | None = DEFAULT_TIMEOUT_S
) -> list[tuple[bool, MatchMethod]]:
    """:func:`answers_equivalent` for each ``(pred, gold)`` pair; with ``timeout_s`` set, every
    math_verify step of the batch goes to the worker in one round trip (each call keeps its own
    deadline)."""
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"answers_equivalent: timeout_s must be > 0 or None, got {timeout_s}")
    prepared = [_prepare(pred, gold) for pred, gold in pairs]
    verify = [i for i, c in enumerate(prepared) if c is not None and not c.guarded]
    verdicts: dict[int, bool | None] = {}
    if timeout_s is None:
        for i in verify:
            c = prepared[i]
            assert c is not None
            verdicts[i] = math_verify_equal(c.pred, c.gold)
    elif verify:
        calls = [(prepared[i].pred, prepared[i].gold) for i in verify]  # type: ignore[union-attr]
        for i, outcome in zip(verify, run_many_with_deadline(math_verify_equal, calls, timeout_s)):
            verdicts[i] = _verdict(outcome, pairs[i][0])
    return [
        (False, "none") if c is None else _decide(c, verdicts.get(i))
        for i, c in enumerate(prepared)
    ]


@dataclass(frozen=True)
class _Comparison:
    pred: str
    gold: str
    guarded: bool
    """Pathological text on either side: math_verify is skipped."""


def _prepare(pred: str | None, gold: str) -> _Comparison | None:
    """The folded texts to compare; None when there is nothing to compare."""
    gold = check_gold(gold)
    if pred is None:
        return None
    if not isinstance(pred, str):
        raise TypeError(
            f"answers_equivalent: pred must be a str or None, got {type(pred).__name__}"
        )
    pred_text = fold_unicode(pred).strip()
    gold_text = fold_unicode(gold).strip()
    if not pred_text:
        return None
    guarded = unsafe_reason(pred_text) is not None or unsafe_reason(gold_text) is not None
    return _Comparison(pred_text, gold_text, guarded)


def _verdict(outcome: Any, pred: str | None) -> bool | None:
    """math_verify's verdict from a worker's outcome; None when the worker gave none."""
    if not isinstance(outcome, Failed):
        return outcome
    if isinstance(outcome.error, DeadlineExceeded | WorkerCrashed):
        logger.warning(
            "math_verify gave no verdict on %.80r (%s); string match only", pred, outcome.error
        )
        return None
    raise outcome.error


def _decide(c: _Comparison, verdict: bool | None) -> tuple[bool, MatchMethod]:
    if verdict:
        return True, "math_verify"
    if c.guarded:  # pathological text: only an exact match (up to whitespace) counts
        same = "".join(c.pred.split()) == "".join(c.gold.split())
    else:
        same = normalize_answer(c.pred) == normalize_answer(c.gold)
    if same:
        return True, "string"
    return False, "math_verify" if verdict is False else "string"
