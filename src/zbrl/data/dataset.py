"""User prompt datasets: conversation JSONL or Parquet files, validated line by line.

One line (or Parquet row) is one prompt::

    {"messages": [{"role": "user", "content": "What is 2+3?"}], "gt_answer": "5"}
    {"messages": {"role": "user", "content": "Read n, print n*2."},
     "test_cases": {"inputs": ["3\\n"], "outputs": ["6\\n"]}}

``messages`` is a list of ``{"role", "content"}`` objects or a single such object. Math rewards
(``think_answer_tags``, ``boxed``) score against ``gt_answer``; the ``code`` reward runs
``test_cases``. :func:`load_examples` checks every line and raises :class:`DatasetError` naming the
file, the line and the fix, or (with ``skip_bad_lines=True``) skips bad lines and reports them.
See ``docs/datasets.md``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from zbrl.rewards.answers import (
    ANSWER_SPECS,
    GT_ANSWER,
    TEST_CASES,
    AnswerError,
    AnswerSpec,
    type_name,
)

logger = logging.getLogger(__name__)

AnswerField = Literal["gt_answer", "test_cases"]
ANSWER_FIELDS: tuple[str, ...] = tuple(ANSWER_SPECS)
ROLES: tuple[str, ...] = ("system", "user", "assistant")
JSONL_SUFFIXES: tuple[str, ...] = (".jsonl", ".ndjson")
PARQUET_SUFFIXES: tuple[str, ...] = (".parquet",)


class DatasetError(ValueError):
    """Bad dataset input. The message names the file, the line (or Parquet row) and the fix."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        """The dataset file, when known."""
        self.line = line
        """1-based line (JSONL) or row (Parquet) number, when the error is about one line."""
        self.reason = reason
        """The problem and its fix, without the location prefix."""


class RowError(Exception):
    """A problem with one line; the loader adds the file and line and turns it into DatasetError."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}. Fix: {fix}")


@dataclass(frozen=True)
class PromptExample:
    """One validated prompt of a dataset."""

    uid: str
    """Stable id: ``"<file stem>:<line>"`` (Parquet: row number counted from 1)."""
    messages: tuple[dict[str, str], ...]
    """The conversation, each message exactly ``{"role", "content"}``."""
    gt_answer: str | None
    """Reference answer for math rewards (None when loaded for ``test_cases``)."""
    test_cases: dict[str, Any] | None
    """``{"inputs": [str], "outputs": [str], optional "fn_name": str}`` for the code reward."""
    source: str
    """Where the example came from: ``"<path>:<line>"``."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Every other column of the line or row, by its name, as read (the reward sees them)."""

    def to_example(self) -> dict[str, Any]:
        """The mapping a reward function receives: ``messages``, ``gt_answer``, ``test_cases``
        and ``fields`` (the line's other columns).

        The result is a fresh copy; callers may mutate it.
        """
        return {
            "messages": [dict(m) for m in self.messages],
            "gt_answer": self.gt_answer,
            "test_cases": copy.deepcopy(self.test_cases),
            "fields": copy.deepcopy(self.fields),
        }


@dataclass
class LoadReport:
    """What :func:`load_examples` read: the usable examples and the skipped lines."""

    examples: list[PromptExample]
    """Usable examples in file order."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(source, reason)`` for each skipped line (only with ``skip_bad_lines=True``)."""

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    def summary(self, max_reasons: int = 3) -> str:
        """One line: how many examples were loaded and skipped, with the first few reasons."""
        text = f"loaded {len(self.examples)} examples, skipped {self.num_skipped} bad lines"
        if self.skipped:
            text += "; first: " + _format_reasons(self.skipped, max_reasons)
        return text


def load_examples(
    path: str | Path,
    *,
    answer_field: AnswerField | AnswerSpec,
    skip_bad_lines: bool = False,
) -> LoadReport:
    """Load and validate a JSONL (``.jsonl``/``.ndjson``) or Parquet (``.parquet``) dataset.

    ``answer_field`` is the field the chosen reward needs: ``"gt_answer"`` for math rewards,
    ``"test_cases"`` for code (the other field is ignored), or the reward's
    :class:`~zbrl.rewards.answers.AnswerSpec` (whose ``needed_by`` names the reward in the
    error of a line without it; :data:`~zbrl.rewards.answers.OPTIONAL_GT_ANSWER` for rewards that
    need no answer: open-ended lines load). Blank JSONL lines are ignored. A bad
    line raises :class:`DatasetError` naming the file, the line and the fix; with
    ``skip_bad_lines=True`` bad lines are skipped, logged (count and first reasons) and listed in
    :attr:`LoadReport.skipped`. A file that yields no usable example always raises.
    """
    if isinstance(answer_field, AnswerSpec):
        answer = answer_field
    elif answer_field in ANSWER_FIELDS:
        answer = ANSWER_SPECS[answer_field]
    else:
        raise ValueError(
            f"answer_field must be one of {', '.join(ANSWER_FIELDS)}, got {answer_field!r}"
        )
    path = Path(path)
    rows, unit = _open_rows(path)
    examples: list[PromptExample] = []
    skipped: list[tuple[str, str]] = []
    for number, row in rows:
        source = f"{path}:{number}"
        try:
            if isinstance(row, _BadLine):
                raise row.error
            examples.append(
                build_example(
                    row,
                    uid=f"{path.stem}:{number}",
                    source=source,
                    answer=answer,
                )
            )
        except RowError as exc:
            reason = str(exc)
            if not skip_bad_lines:
                raise DatasetError(
                    f"{path} {unit} {number}: {reason}",
                    path=str(path),
                    line=number,
                    reason=reason,
                ) from None
            skipped.append((source, reason))
    report = LoadReport(examples=examples, skipped=skipped)
    if not examples:
        message = f"no usable examples in {path} ({len(skipped)} lines skipped)"
        if skipped:
            message += "; first: " + _format_reasons(skipped, 3)
        else:
            message += f". Fix: the file has no non-blank {unit}s; add one JSON object per line"
        raise DatasetError(message, path=str(path))
    if skipped:
        logger.warning("%s: %s", path, report.summary())
    return report


# ---------------------------------------------------------------------------------------------
# Reading rows


def _open_rows(path: Path) -> tuple[Iterator[tuple[int, Any]], str]:
    """Check the file and return an iterator of ``(1-based number, row)`` and the unit name."""
    if not path.exists():
        raise DatasetError(
            f"dataset file {path} does not exist. Fix: check the path "
            f"(relative paths are resolved from {os.getcwd()})",
            path=str(path),
        )
    if not path.is_file():
        raise DatasetError(
            f"dataset path {path} is not a file. Fix: point at one .jsonl or .parquet file",
            path=str(path),
        )
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return _iter_jsonl(path), "line"
    if suffix in PARQUET_SUFFIXES:
        return _iter_parquet(path), "row"
    supported = ", ".join(JSONL_SUFFIXES + PARQUET_SUFFIXES)
    raise DatasetError(
        f"unsupported dataset file extension {path.suffix or '(none)'!r} for {path}. Fix: write "
        f"the data as JSONL (one JSON object per line) or Parquet; supported: {supported}",
        path=str(path),
    )


class _BadLine:
    """Marker row for a line that could not be decoded; carries the error to raise or skip."""

    def __init__(self, error: RowError) -> None:
        self.error = error


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            row = _decode_jsonl_line(raw, first=number == 1)
            if row is not _BLANK:
                yield number, row


_BLANK = object()


def _decode_jsonl_line(raw: bytes, *, first: bool) -> Any:
    """The JSON value of one line, ``_BLANK`` for a blank line, or a ``_BadLine``."""
    try:
        text = raw.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as exc:
        problem = f"the line is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        return _BadLine(RowError(problem, "save the file as UTF-8"))
    if not text.strip():
        return _BLANK
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fix = (
            "write exactly one complete JSON object per line (an object must not span several "
            "lines; strings use double quotes)"
        )
        return _BadLine(RowError(f"invalid JSON ({exc.msg} at column {exc.colno})", fix))


def _iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        number = 0
        for batch in parquet.iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(
            f"cannot read {path} as Parquet ({exc}). Fix: check that the file is a complete "
            f"Parquet file (e.g. written with pyarrow.parquet.write_table)",
            path=str(path),
        ) from None


# ---------------------------------------------------------------------------------------------
# Validating one row


def build_example(
    row: Any,
    *,
    uid: str,
    source: str,
    answer: AnswerSpec,
    prompt_column: str = "messages",
    answer_column: str | None = None,
    text_prompts: bool = False,
) -> PromptExample:
    """Validate one row: its ``prompt_column`` becomes the messages, its ``answer_column``
    (default: the answer field itself) the reward's answer field, and every other column goes to
    ``fields``. ``text_prompts`` also accepts a string prompt (sent as the user message). Raises
    :class:`RowError` with the problem and the fix."""
    answer_column = answer_column or answer.field
    if not isinstance(row, dict):
        raise RowError(
            f"expected a JSON object, got {type_name(row)}",
            'write one object per line, e.g. {"messages": [{"role": "user", "content": "..."}], '
            + answer.example_json
            + "}",
        )
    messages = _parse_messages(row, prompt_column, text_prompts)
    raw_answer = row.get(answer_column)
    if raw_answer is None and answer_column != answer.field and answer.required:
        raise RowError(
            f"the answer column '{answer_column}' is missing or null (columns: "
            f"{', '.join(map(str, row)) or 'none'})",
            "name the column that holds the reference answer in data.source.columns.answer",
        )
    try:
        value = answer.read({answer.field: raw_answer})  # the reward's own parser
    except AnswerError as exc:
        problem = exc.problem
        if answer_column != answer.field:
            problem = f"the answer column '{answer_column}': {problem}"
        raise RowError(problem, exc.fix) from None
    extras = {k: v for k, v in row.items() if k not in (prompt_column, answer_column)}
    return PromptExample(
        uid=uid,
        messages=messages,
        gt_answer=value if answer.field == GT_ANSWER.field else None,
        test_cases=value if answer.field == TEST_CASES.field else None,
        source=source,
        fields=extras,
    )


def _parse_messages(
    row: dict[str, Any], column: str, text_prompts: bool
) -> tuple[dict[str, str], ...]:
    raw = row.get(column)
    if raw is None:
        if text_prompts:
            raise RowError(
                f"the prompt column '{column}' is missing or null (columns: "
                f"{', '.join(map(str, row)) or 'none'})",
                "name the column that holds the prompt in data.source.columns.prompt",
            )
        raise RowError(
            "'messages' is missing",
            'add "messages": [{"role": "user", "content": "<the prompt>"}] (a list of '
            "{role, content} objects, or one such object)",
        )
    if text_prompts and isinstance(raw, str):
        if not raw.strip():
            raise RowError(f"the prompt '{column}' is empty", "give every row a prompt")
        return ({"role": "user", "content": raw},)
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise RowError(
            f"'{column}' must be a list of {{role, content}} objects or one such object"
            + (" or a string" if text_prompts else "")
            + f", got {type_name(raw)}",
            f'write "{column}": [{{"role": "user", "content": "<the prompt>"}}]',
        )
    if not raw:
        raise RowError(
            f"'{column}' is empty",
            'give at least one message: [{"role": "user", "content": "<the prompt>"}]',
        )
    messages = tuple(_parse_message(i, m) for i, m in enumerate(raw, start=1))
    if not any(m["role"] == "user" for m in messages):
        raise RowError(
            f"'{column}' has no user message",
            'add {"role": "user", "content": "<the prompt>"}',
        )
    return messages


def _parse_message(index: int, message: Any) -> dict[str, str]:
    where = f"message {index}"
    if not isinstance(message, dict):
        raise RowError(
            f"{where} must be an object with 'role' and 'content', got {type_name(message)}",
            'write each message as {"role": "user", "content": "..."}',
        )
    role = message.get("role")
    if role is None:
        raise RowError(
            f"{where} has no 'role'",
            f'add "role": one of {", ".join(ROLES)}',
        )
    if not isinstance(role, str) or role not in ROLES:
        raise RowError(
            f"{where} has unknown role {role!r}",
            f"use one of the allowed roles: {', '.join(ROLES)}",
        )
    content = message.get("content")
    if content is None:
        raise RowError(
            f"{where} ({role}) has no 'content'",
            'add "content": "<text>" to the message',
        )
    if not isinstance(content, str):
        raise RowError(
            f"content of {where} ({role}) must be a string, got {type_name(content)}",
            "give the content as one string (lists of content parts are not supported; "
            "join the text parts)",
        )
    if not content.strip():
        raise RowError(
            f"content of {where} ({role}) is empty or whitespace",
            "give the message some text, or remove it",
        )
    return {"role": role, "content": content}


def _format_reasons(skipped: list[tuple[str, str]], limit: int) -> str:
    text = "; ".join(f"{source}: {reason}" for source, reason in skipped[:limit])
    if len(skipped) > limit:
        text += f"; ... and {len(skipped) - limit} more"
    return text
