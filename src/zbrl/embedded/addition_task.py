"""A deterministic synthetic arithmetic task, written as conversation JSONL like a user dataset.

Each row is ``{"messages": [system, user], "gt_answer": "85"}`` for a problem such as ``37+48``.
The target completion is ``<think>7+8=15,3+4+1=8</think><answer>85</answer>``: the think block
adds the columns right to left, writing the carry into the next column, so that each answer
digit is the last digit of one column sum. That gives a tiny model a short algorithm to follow
(responses stay under ~32 tokens with the character-level tokenizer).

The held-out split is a fixed hash partition of the *problem space* (independent of the seed and
of the split sizes): a problem is held out iff a salted hash of ``"a+b"`` falls in the held-out
fraction. Any train rows (including the warm start's) and any eval rows are therefore disjoint.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Literal

SYSTEM_PROMPT = "Format: <think></think><answer></answer>"
"""Short on purpose: with a character-level tokenizer every character is a token."""
HELDOUT_FRACTION = 0.1
"""Fraction of the problem space reserved for the held-out (eval) split."""
_SPLIT_SALT = "zbrl-arithmetic-v1"

Split = Literal["train", "eval", "any"]

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def problem_split(a: int, b: int) -> Literal["train", "eval"]:
    """The split a problem ``a+b`` belongs to (fixed for all seeds and sizes)."""
    digest = hashlib.sha256(f"{_SPLIT_SALT}:{a}+{b}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2.0**64
    return "eval" if bucket < HELDOUT_FRACTION else "train"


def _operand_range(min_digits: int, max_digits: int) -> tuple[int, int]:
    return (0 if min_digits == 1 else 10 ** (min_digits - 1)), 10**max_digits - 1


def _problem_space_size(min_digits: int, max_digits: int) -> int:
    low, high = _operand_range(min_digits, max_digits)
    return (high - low + 1) ** 2


def _check_digits(min_digits: int, max_digits: int) -> None:
    if not 1 <= min_digits <= max_digits <= 6:
        raise ValueError(
            f"need 1 <= min_digits <= max_digits <= 6, got min_digits={min_digits}, "
            f"max_digits={max_digits}"
        )


def think_steps(a: int, b: int) -> str:
    """Column addition right to left: ``37+48`` → ``7+8=15,3+4+1=8``.

    A column is ``x+y=s`` or ``x+y+1=s`` with the carry from the previous column; the shorter
    operand is padded with 0. A final carry needs no step: it is the answer's leading 1.
    """
    xs, ys = str(a)[::-1], str(b)[::-1]
    width = max(len(xs), len(ys))
    xs, ys = xs.ljust(width, "0"), ys.ljust(width, "0")
    steps, carry = [], 0
    for x, y in zip(xs, ys):
        total = int(x) + int(y) + carry
        steps.append(f"{x}+{y}+1={total}" if carry else f"{x}+{y}={total}")
        carry = total // 10
    return ",".join(steps)


def make_row(a: int, b: int, *, system_prompt: str = SYSTEM_PROMPT) -> dict:
    """One conversation row for ``a+b``."""
    return {
        "messages": [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": f"What is {a}+{b}?"},
        ],
        "gt_answer": str(a + b),
    }


def make_arithmetic_rows(
    n: int,
    *,
    seed: int,
    min_digits: int = 1,
    max_digits: int = 2,
    split: Split = "any",
    system_prompt: str = SYSTEM_PROMPT,
) -> list[dict]:
    """``n`` distinct problems ``a+b``, operands uniform over ``min_digits``..``max_digits`` digits.

    Deterministic for a given ``seed`` and arguments. ``split`` restricts the problems to the
    train or held-out (eval) part of the problem space (see :func:`problem_split`).
    """
    _check_digits(min_digits, max_digits)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    share = {"any": 1.0, "eval": HELDOUT_FRACTION, "train": 1.0 - HELDOUT_FRACTION}[split]
    available = int(_problem_space_size(min_digits, max_digits) * share * 0.9)
    if n > available:
        raise ValueError(
            f"asked for {n} distinct {split!r} problems with {min_digits}..{max_digits}-digit "
            f"operands but only about {available} exist; lower n or raise max_digits"
        )
    low, high = _operand_range(min_digits, max_digits)
    rng = random.Random(f"zbrl-arithmetic:{seed}:{split}:{min_digits}:{max_digits}")
    seen: set[tuple[int, int]] = set()
    rows: list[dict] = []
    while len(rows) < n:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (a, b) in seen or (split != "any" and problem_split(a, b) != split):
            continue
        seen.add((a, b))
        rows.append(make_row(a, b, system_prompt=system_prompt))
    return rows


def parse_problem(row: dict) -> tuple[int, int]:
    """The operands of a row made by :func:`make_row`."""
    user = next(m["content"] for m in row["messages"] if m["role"] == "user")
    match = re.fullmatch(r"What is (\d+)\+(\d+)\?", user)
    if match is None:
        raise ValueError(f"not a synthetic arithmetic row: user message {user!r}")
    return int(match.group(1)), int(match.group(2))


def reference_completion(row: dict) -> str:
    """The ideal assistant response, e.g. ``<think>7+8=15,3+4+1=8</think><answer>85</answer>``."""
    a, b = parse_problem(row)
    return f"<think>{think_steps(a, b)}</think><answer>{a + b}</answer>"


def extract_answer(text: str) -> str | None:
    """The content of the last ``<answer>…</answer>`` block, or None."""
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


def write_jsonl(path: str | Path, rows: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def write_task(
    directory: str | Path,
    *,
    n_train: int,
    n_eval: int,
    seed: int,
    min_digits: int = 1,
    max_digits: int = 2,
) -> tuple[Path, Path]:
    """Write ``train.jsonl`` and ``eval.jsonl`` (held out, disjoint from train) to ``directory``."""
    directory = Path(directory)
    train = make_arithmetic_rows(
        n_train, seed=seed, min_digits=min_digits, max_digits=max_digits, split="train"
    )
    held_out = make_arithmetic_rows(
        n_eval, seed=seed, min_digits=min_digits, max_digits=max_digits, split="eval"
    )
    return (
        write_jsonl(directory / "train.jsonl", train),
        write_jsonl(directory / "eval.jsonl", held_out),
    )
