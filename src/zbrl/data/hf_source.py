"""Prompts from a Hugging Face ``datasets`` dataset: local data files, a saved dataset, or a hub
name, with a column mapping.

The dataset is opened by :func:`open_hf_split` (``load_from_disk`` for a directory written by
``save_to_disk``, ``load_dataset`` otherwise) and every row is validated by the same rules as a
conversation file (:func:`zbrl.data.dataset.build_example`): the prompt column becomes the
messages (a string is the user message), the answer column the reward's answer field, and every
other column reaches the reward in ``example["fields"]``.

A hub name needs the network. The hub is probed first (a few seconds at most), so that an offline
machine gets a :class:`~zbrl.errors.RunError` naming the dataset and how to fetch it beforehand
instead of ``datasets``' retries. With ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``) the
hub is not probed and ``datasets`` reads its cache.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from zbrl.data.dataset import DatasetError, LoadReport, RowError, build_example
from zbrl.errors import RunError
from zbrl.rewards.answers import AnswerSpec

logger = logging.getLogger(__name__)

DATA_FILE_BUILDERS: dict[str, str] = {
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}
"""Local data file suffix → the ``datasets`` builder that reads it."""
PROBE_TIMEOUT_S = 5.0
"""How long the hub probe waits for a TCP connection."""
OFFLINE_VARIABLES: tuple[str, ...] = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def load_hf_examples(
    path: str,
    *,
    split: str,
    answer: AnswerSpec,
    prompt_column: str,
    answer_column: str,
    name: str | None = None,
    skip_bad_lines: bool = False,
    where: str = "data.source",
) -> LoadReport:
    """Validated examples of one split. Every row becomes a :class:`PromptExample` with uid
    ``"<dataset>:<split>:<row>"`` (rows counted from 1); a bad row raises :class:`DatasetError`
    naming the dataset, the split, the row and the fix (or is skipped with ``skip_bad_lines``)."""
    dataset = open_hf_split(path, split=split, name=name, where=where)
    label = f"{path}[{split}]"
    missing = [c for c in (prompt_column, answer_column) if c not in dataset.column_names]
    if missing:
        raise DatasetError(
            f"{label} has no column {', '.join(map(repr, missing))} (columns: "
            f"{', '.join(dataset.column_names)}). Fix: map the columns with "
            f"{where}.columns.prompt and {where}.columns.answer",
            path=path,
        )
    stem = Path(path).stem if Path(path).exists() else path
    examples = []
    skipped: list[tuple[str, str]] = []
    for number, row in enumerate(dataset, start=1):
        source = f"{label}:{number}"
        try:
            examples.append(
                build_example(
                    row,
                    uid=f"{stem}:{split}:{number}",
                    source=source,
                    answer=answer,
                    prompt_column=prompt_column,
                    answer_column=answer_column,
                    text_prompts=True,
                )
            )
        except RowError as exc:
            if not skip_bad_lines:
                raise DatasetError(
                    f"{label} row {number}: {exc}", path=path, line=number, reason=str(exc)
                ) from None
            skipped.append((source, str(exc)))
    report = LoadReport(examples=examples, skipped=skipped)
    if not examples:
        raise DatasetError(
            f"no usable examples in {label} ({len(skipped)} rows skipped)"
            + (f"; first: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""),
            path=path,
        )
    if skipped:
        logger.warning("%s: %s", label, report.summary())
    return report


def open_hf_split(path: str, *, split: str, name: str | None = None, where: str = "data.source"):
    """The ``datasets.Dataset`` of ``split``: a saved dataset, local data files, or a hub name."""
    import datasets

    local = Path(path).expanduser()
    if is_saved_dataset(local):
        loaded = datasets.load_from_disk(str(local))
        return _pick_split(loaded, split, path, where)
    if local.is_file():
        builder = DATA_FILE_BUILDERS.get(local.suffix.lower())
        if builder is None:
            raise DatasetError(
                f"{where}.path={path!r}: unsupported file type {local.suffix or '(none)'!r}. "
                f"Fix: use one of {', '.join(DATA_FILE_BUILDERS)}",
                path=path,
            )
        if split != "train":
            raise DatasetError(
                f"{where}.path={path!r} is a single data file, which has one split ('train'), "
                f"not {split!r}. Fix: put the splits in one directory as train.jsonl, "
                "test.jsonl, ... and point path at it",
                path=path,
            )
        return _load(builder, where, path, data_files=str(local), split="train")
    if local.is_dir():
        return _load(str(local), where, path, split=split)
    if local.is_absolute() or path.startswith((".", "~")) or local.suffix in DATA_FILE_BUILDERS:
        raise DatasetError(
            f"{where}.path={path!r} does not exist. Fix: check the path (relative paths are "
            f"resolved from {os.getcwd()})",
            path=path,
        )
    if not hub_offline_mode():
        check_hub_reachable(path, name, split, where)
    return _load(path, where, path, name=name, split=split)


def is_saved_dataset(path: Path) -> bool:
    """A directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return path.is_dir() and (
        (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()
    )


def _pick_split(loaded: Any, split: str, path: str, where: str) -> Any:
    import datasets

    if isinstance(loaded, datasets.Dataset):
        if split != "train":
            raise DatasetError(
                f"{where}.path={path!r} is one saved split, not a dataset of splits, so "
                f"split={split!r} cannot be chosen. Fix: save a DatasetDict, or use split: train",
                path=path,
            )
        return loaded
    if split not in loaded:
        raise DatasetError(
            f"{where}: split {split!r} is not in {path!r} (splits: {', '.join(loaded)}). "
            f"Fix: set {where}.split (or eval_split) to one of them",
            path=path,
        )
    return loaded[split]


def _load(target: str, where: str, path: str, **kwargs: Any) -> Any:
    import datasets

    try:
        with _quiet_on_failure(datasets):
            return datasets.load_dataset(target, **kwargs)
    except ConnectionError as exc:
        hint = fetch_hint(path, kwargs.get("name"))
        raise RunError(f"{where}.path={path!r}: {exc}. {hint}") from None
    except ValueError as exc:  # an unknown split and the like
        raise DatasetError(f"{where}.path={path!r}: {exc}", path=path) from None
    except FileNotFoundError as exc:
        raise DatasetError(
            f"{where}.path={path!r}: {exc}. Fix: check the path or the dataset name", path=path
        ) from None
    except datasets.exceptions.DatasetGenerationError as exc:  # a data file that does not parse
        cause = exc.__cause__ or exc
        reason = " ".join(f"{type(cause).__name__}: {cause}".split())  # one line
        raise DatasetError(
            f"{where}.path={path!r}: the data cannot be read ({reason}). Fix: repair the file "
            "(one JSON object per line for .jsonl) or point path at another",
            path=path,
        ) from None


@contextlib.contextmanager
def _quiet_on_failure(datasets: Any) -> Iterator[None]:
    """``datasets`` logs a file's parse failure (and draws its progress bar) on stderr before it
    raises; the error line the command prints says it once. Logging and progress bars are back
    as they were after."""
    from datasets.utils import logging as ds_logging

    verbosity = ds_logging.get_verbosity()
    bars_were_on = not datasets.utils.are_progress_bars_disabled()
    ds_logging.set_verbosity(logging.CRITICAL)
    datasets.utils.disable_progress_bars()
    try:
        yield
    finally:
        ds_logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.utils.enable_progress_bars()


def hub_offline_mode() -> bool:
    """True when the environment tells ``datasets`` to use its cache only."""
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE_VARIABLES
    )


def check_hub_reachable(path: str, name: str | None, split: str, where: str) -> None:
    """Raise :class:`RunError` (naming the dataset and how to fetch it) when the hub does not
    answer within :data:`PROBE_TIMEOUT_S`."""
    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
    raise RunError(
        f"{where}.path={path!r} is not a local file or directory, so it names a Hugging Face hub "
        f"dataset, but the hub ({constants.ENDPOINT}) is unreachable from here ({reason}). "
        + fetch_hint(path, name)
    )


def fetch_hint(path: str, name: str | None) -> str:
    """How to fetch a hub dataset beforehand, for error messages."""
    config = f", {name!r}" if name else ""
    return (
        'Fix: fetch it beforehand on a machine with internet access: python -c "import datasets; '
        f"datasets.load_dataset({path!r}{config}).save_to_disk('DIR')\", copy DIR here and set "
        "data.source.path=DIR; or, when it is already in the Hugging Face cache, set "
        "HF_HUB_OFFLINE=1"
    )
