"""Taking the answer out of a response: one set of extractors shared by the rewards.

* ``full``: the whole response, stripped;
* ``last_number``: the last number in the response (:func:`last_number`);
* ``answer_tags``: the content of the last ``<answer>…</answer>``;
* ``boxed``: the content of the last top-level ``\\boxed{…}``.

:func:`extract_answer` returns the answer, or None when the response has none in that format.
The ``last_number`` reward and the ``reasoning_gym`` reward's ``extract`` option use these same
functions. Each extraction has a default system prompt asking the model for its format.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from zbrl.rewards.answer_check import fold_unicode
from zbrl.rewards.boxed import last_boxed

EXTRACTIONS: tuple[str, ...] = ("full", "last_number", "answer_tags", "boxed")

# A number: an optional sign (not when it follows a digit, letter, ')' or ']', as in "5-3"),
# digits with optional thousands separators ("1,234"), and an optional decimal part.
_NUMBER = re.compile(r"(?<![\w.)\]])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])\.\d+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

EXTRACTION_PROMPTS: dict[str, str] = {
    "full": "Answer with only the final answer, nothing else.",
    "last_number": "Solve the problem. End your response with the final answer as a number.",
    "answer_tags": (
        "Think about the problem step by step. Then write the final answer, and only the final "
        "answer, between <answer> and </answer>."
    ),
    "boxed": (
        "Reason about the problem step by step, then give the final answer inside \\boxed{}, "
        "for example \\boxed{42}."
    ),
}
"""The default system prompt of each extraction: the format it reads."""


def last_number(text: str) -> str | None:
    """The last number in ``text`` in plain form (``"1,234.50"`` → ``"1234.50"``, ``"−3"`` →
    ``"-3"``), or None. A minus sign counts when it does not follow a digit or letter, so
    ``"5-3"`` ends with ``3`` and ``"= -2"`` with ``-2``."""
    matches = _NUMBER.findall(fold_unicode(text))
    if not matches:
        return None
    number = matches[-1].replace(",", "")
    return "0" + number if number.startswith(".") else number


def answer_tags(text: str) -> str | None:
    """The stripped content of the last ``<answer>…</answer>``, or None (also when empty)."""
    matches = _ANSWER_TAG.findall(text)
    answer = matches[-1].strip() if matches else ""
    return answer or None


def full(text: str) -> str | None:
    """The whole response, stripped; None when it is blank."""
    return text.strip() or None


def boxed(text: str) -> str | None:
    """The stripped content of the last top-level ``\\boxed{…}``, or None."""
    answer = last_boxed(text)
    return answer.strip() or None if answer is not None else None


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "full": full,
    "last_number": last_number,
    "answer_tags": answer_tags,
    "boxed": boxed,
}


def extract_answer(text: str, how: str) -> str | None:
    """The answer of ``text`` by extraction ``how`` (one of :data:`EXTRACTIONS`), or None."""
    try:
        return EXTRACTORS[how](text)
    except KeyError:
        raise ValueError(
            f"unknown answer extraction {how!r}; use one of {', '.join(EXTRACTIONS)}"
        ) from None
