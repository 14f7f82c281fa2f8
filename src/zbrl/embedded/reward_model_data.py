"""Training data for the embedded reward model that needs no sampling: the reference completion
of an addition problem and systematic corruptions of it, with per-token prefix labels.

A corruption is what a policy that is learning column addition gets wrong, each with the carry
and the answer following the wrong step as the policy's own mistakes do: a column sum off by a
few, a dropped carry, a misread operand digit; and answers that do not follow the trace: a wrong,
inserted, dropped or reversed digit, a leading ``1``, the last digit repeated or cut, the full
trace of a nearby problem; and broken formats: the trace cut after a column and closed with
``</answer>`` (the exploit RL found in the first tokenwise classifier), or the completion cut
anywhere. :func:`is_right` labels each (most are wrong; a corruption whose answer is still right
and well formed is labelled right).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from zbrl.embedded.addition_task import parse_problem

_WELL_FORMED = re.compile(r"<think>[^<]*</think><answer>([^<]*)</answer>")

KINDS = (
    "column_sum", "column_sum", "dropped_carry", "misread_digit", "answer_digit",
    "inserted_digit", "dropped_digit", "reversed_answer", "nearby_problem", "leading_one",
    "cut_last_digit", "repeated_last_digit", "broken_format", "truncated",
)  # fmt: skip
"""Corruption kinds, drawn uniformly (a wrong column sum, the policy's commonest error, twice)."""


def column_trace(
    a: int,
    b: int,
    *,
    delta: tuple[int, int] | None = None,
    drop_carry: int | None = None,
    misread: tuple[int, int, int] | None = None,
) -> tuple[str, str]:
    """(think steps, answer) of column addition right to left, as
    :func:`zbrl.embedded.addition_task.think_steps` writes them, with optional mistakes:
    ``delta=(col, d)`` adds ``d`` to one column's sum, ``drop_carry=col`` ignores the carry into a
    column, ``misread=(col, operand, digit)`` reads one operand digit wrong. The carries and the
    answer follow the (possibly wrong) sums."""
    xs, ys = str(a)[::-1], str(b)[::-1]
    width = max(len(xs), len(ys))
    digits_x, digits_y = list(xs.ljust(width, "0")), list(ys.ljust(width, "0"))
    if misread is not None:
        col, operand, digit = misread
        (digits_x if operand == 0 else digits_y)[col] = str(digit)
    steps, answer, carry = [], [], 0
    for col, (x, y) in enumerate(zip(digits_x, digits_y)):
        c = 0 if drop_carry == col else carry
        total = int(x) + int(y) + c
        if delta is not None and delta[0] == col:
            total = max(0, total + delta[1])
        steps.append(f"{x}+{y}+1={total}" if c else f"{x}+{y}={total}")
        answer.append(str(total % 10))
        carry = 1 if total >= 10 else 0
    return ",".join(steps), ("1" if carry else "") + "".join(reversed(answer))


def completion(think: str, answer: str) -> str:
    return f"<think>{think}</think><answer>{answer}</answer>"


def corruptions(row: dict, rng: random.Random, k: int) -> list[str]:
    """Up to ``k`` distinct corrupted completions of ``row``'s problem (none equal to the
    reference; see the module docstring)."""
    a, b = parse_problem(row)
    think, answer = column_trace(a, b)
    reference = completion(think, answer)
    width = max(len(str(a)), len(str(b)))
    out: list[str] = []
    for _ in range(3 * k):
        if len(out) >= k:
            break
        kind = rng.choice(KINDS)
        t, ans = think, answer
        if kind == "column_sum":
            t, ans = column_trace(
                a, b, delta=(rng.randrange(width), rng.choice([-3, -2, -1, 1, 2, 3]))
            )
        elif kind == "dropped_carry":
            t, ans = column_trace(a, b, drop_carry=rng.randrange(1, width) if width > 1 else 0)
        elif kind == "misread_digit":
            t, ans = column_trace(
                a, b, misread=(rng.randrange(width), rng.randrange(2), rng.randrange(10))
            )
        elif kind == "answer_digit":
            i = rng.randrange(len(answer))
            ans = answer[:i] + str(rng.randrange(10)) + answer[i + 1 :]
        elif kind == "inserted_digit":
            i = rng.randrange(len(answer) + 1)
            ans = answer[:i] + str(rng.randrange(10)) + answer[i:]
        elif kind == "dropped_digit" and len(answer) > 1:
            i = rng.randrange(len(answer))
            ans = answer[:i] + answer[i + 1 :]
        elif kind == "reversed_answer":
            ans = answer[::-1]
        elif kind == "nearby_problem":
            a2 = min(99, max(0, a + rng.choice([-10, -1, 0, 1, 10])))
            b2 = min(99, max(0, b + rng.choice([-10, -1, 1, 10])))
            t, ans = column_trace(a2, b2)
        elif kind == "leading_one":
            ans = "1" + answer
        elif kind == "cut_last_digit":
            ans = answer[:-1] or "0"
        elif kind == "repeated_last_digit":
            ans = answer + answer[-1]
        text = completion(t, ans)
        if kind == "broken_format":
            steps = t.split(",")
            text = "<think>" + ",".join(steps[: rng.randrange(1, len(steps) + 1)]) + "</answer>"
        elif kind == "truncated":
            text = reference[: rng.randrange(1, len(reference))]
        if text != reference and text not in out:
            out.append(text)
    return out


def is_right(response: str, gt_answer: str) -> bool:
    """A well-formed ``<think>…</think><answer>N</answer>`` whose answer is ``gt_answer`` (the
    verifier's verdict on these synthetic completions)."""
    match = _WELL_FORMED.fullmatch(response)
    return match is not None and match.group(1) == gt_answer


def first_deviation(response: str, reference: str) -> int | None:
    """The index of the first character where ``response`` leaves ``reference`` (None when they
    are equal)."""
    if response == reference:
        return None
    return next(
        (i for i, (x, y) in enumerate(zip(response, reference)) if x != y),
        min(len(response), len(reference)),
    )


def prefix_labels(
    offsets: Sequence[tuple[int, int]],
    response_start: int,
    deviation: int | None,
    label: float,
) -> tuple[list[float], list[float]]:
    """Per-token (labels, weights) for one rendered pair: prompt tokens weigh 0; a response token
    is labelled 1 while the response so far is a prefix of the reference completion, and the
    response's own 0/1 label from the first token that leaves it (every token of a right
    response is labelled 1: ``deviation`` None). The last token's label is the response's."""
    labels, weights = [], []
    for _, end in offsets:
        if end <= response_start:
            labels.append(0.0)
            weights.append(0.0)
            continue
        on_reference = deviation is None or end <= response_start + deviation
        labels.append(1.0 if on_reference else label)
        weights.append(1.0)
    return labels, weights
