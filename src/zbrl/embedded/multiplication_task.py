"""The tool demo's task: products of two 3-digit numbers, which the embedded model cannot work
out in its head but can copy from a calculator.

Rows are conversation JSONL like the addition task's (``{"messages": [system, user],
"gt_answer": "217916"}``), in two variants that differ only in the system prompt and in the
traces the warm start teaches:

* with the calculator (``tools=True``): turn 1 ``<calc>347*628</calc>``, the calculator's answer
  ``217916`` comes back as the next message, turn 2 ``<answer>217916</answer>``;
* without (``tools=False``): one turn, ``<answer>217916</answer>``.

The held-out split is a fixed hash partition of the problem space, as for the addition task.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Literal

TOOLS_SYSTEM_PROMPT = "Use <calc>a*b</calc>, then <answer></answer>"
PLAIN_SYSTEM_PROMPT = "Format: <answer></answer>"
HELDOUT_FRACTION = 0.1
_SALT = "zbrl-multiplication-v1"
LOW, HIGH = 100, 999
"""Operand range: both factors have 3 digits."""


def problem_split(a: int, b: int) -> Literal["train", "eval"]:
    digest = hashlib.sha256(f"{_SALT}:{a}*{b}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2.0**64 < HELDOUT_FRACTION else "train"


def make_row(a: int, b: int, *, tools: bool) -> dict:
    system = TOOLS_SYSTEM_PROMPT if tools else PLAIN_SYSTEM_PROMPT
    return {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"What is {a}*{b}?"},
        ],
        "gt_answer": str(a * b),
    }


def operands(row: dict) -> tuple[int, int]:
    user = next(m["content"] for m in row["messages"] if m["role"] == "user")
    a, b = user.removeprefix("What is ").removesuffix("?").split("*")
    return int(a), int(b)


def make_rows(n: int, *, seed: int, split: Literal["train", "eval"], tools: bool) -> list[dict]:
    """``n`` distinct problems of ``split``, deterministic for ``seed``."""
    rng = random.Random(f"{_SALT}:{seed}:{split}")
    seen: set[tuple[int, int]] = set()
    rows: list[dict] = []
    while len(rows) < n:
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        if (a, b) in seen or problem_split(a, b) != split:
            continue
        seen.add((a, b))
        rows.append(make_row(a, b, tools=tools))
    return rows


def trace(row: dict, *, tools: bool) -> list[tuple[str, str]]:
    """The ideal episode as (role, content) turns after the prompt: assistant turns and the
    calculator's message (``user``, the embedded template's role for it)."""
    a, b = operands(row)
    answer = ("assistant", f"<answer>{a * b}</answer>")
    if not tools:
        return [answer]
    return [("assistant", f"<calc>{a}*{b}</calc>"), ("user", str(a * b)), answer]


def write_task(
    directory: str | Path, *, n_train: int, n_eval: int, seed: int, tools: bool
) -> tuple[Path, Path]:
    """``train.jsonl`` and ``eval.jsonl`` (held out) in ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for split, n in (("train", n_train), ("eval", n_eval)):
        path = directory / f"{split}.jsonl"
        rows = make_rows(n, seed=seed, split=split, tools=tools)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        out.append(path)
    return out[0], out[1]
