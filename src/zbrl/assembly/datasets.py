"""The run's datasets: which data each set reads (a file or a split of ``data.source``), loading
and validating it, and encoding the prompts with the run's reward and data settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from zbrl.assembly.embedded import embedded_task_files
from zbrl.assembly.environments import episode_tool_prompt
from zbrl.assembly.rewards import answer_spec, default_system_prompt
from zbrl.config import (
    EMBEDDED,
    HELD_OUT,
    HfSource,
    ReasoningGymSource,
    RunConfig,
)
from zbrl.data.dataset import LoadReport, load_examples
from zbrl.data.prompts import PromptEncoder, resolve_system_prompt
from zbrl.errors import RunError

if TYPE_CHECKING:  # zbrl.types imports torch, which the pre-flight checks do without
    from zbrl.types import EncodedPrompt


@dataclass(frozen=True)
class SourceSplit:
    """One split of ``data.source``: its training prompts or its held-out ones."""

    source: HfSource | ReasoningGymSource
    """The configured source."""
    split: Literal["train", "eval"]
    """``train`` (the prompts trained on) or ``eval`` (the held-out split)."""

    def __str__(self) -> str:
        return f"data.source ({self.source.type}, {self.split})"


DatasetRef = Path | SourceSplit
"""What a set reads: a conversation file, or a split of the configured source."""


def needs_embedded_task(cfg: RunConfig) -> bool:
    """True when a set reads the embedded synthetic task (its files must be written)."""
    return cfg.data.trains_on_embedded or EMBEDDED in cfg.eval.sets.values()


@dataclass(frozen=True)
class DatasetRefs:
    """What the training set and each eval set read, opened by the pre-flight; None where a set
    reads the embedded task, whose files the build writes (:meth:`with_task_files`)."""

    train: DatasetRef | None
    """``data.train_path``'s file or ``data.source``'s train split (None: the embedded task)."""
    evals: dict[str, DatasetRef | None]
    """Each of ``eval.sets``: a file or the source's held-out split (None: the embedded
    task's held-out split)."""

    def with_task_files(
        self, task_train: Path | None, task_eval: Path | None
    ) -> tuple[DatasetRef, dict[str, DatasetRef]]:
        """Every set's reference, the embedded task's files filled in."""
        train = self.train if self.train is not None else task_train
        assert train is not None  # written by the build when a set reads the embedded task
        evals: dict[str, DatasetRef] = {}
        for name, ref in self.evals.items():
            evals[name] = ref if ref is not None else _given(task_eval)
        return train, evals


def _given(path: Path | None) -> Path:
    assert path is not None  # written by the build when a set reads the embedded task
    return path


def open_dataset_refs(cfg: RunConfig) -> DatasetRefs:
    """Pre-flight, the first half of the build: the dataset files the run reads
    (``data.train_path``, file-valued ``eval.sets``) exist and can be read, and ``data.source``
    can give data. Every line is validated later, still before the run directory, when the
    prompts are encoded. Raises RunError (or DatasetError) naming the field."""
    source = cfg.data.source
    train: DatasetRef | None = None
    if source is not None:
        train = SourceSplit(source, "train")
    elif not cfg.data.trains_on_embedded:
        check_readable_file(cfg.data.train_path, "data.train_path")
        train = Path(cfg.data.train_path)
    evals: dict[str, DatasetRef | None] = {}
    for name, value in cfg.eval.sets.items():
        if value == HELD_OUT and source is not None:
            evals[name] = SourceSplit(source, "eval")
        elif value in (HELD_OUT, EMBEDDED):  # held_out of the embedded task: its eval split
            evals[name] = None
        else:
            check_readable_file(value, f"eval.sets.{name}")
            evals[name] = Path(value)
    check_data_source(cfg)
    return DatasetRefs(train, evals)


def check_readable_file(path: str, field: str) -> None:
    """A RunError naming ``field`` unless ``path`` is a file this process can read."""
    p = Path(path).expanduser()
    where = f"{field}={path!r}"
    if not p.exists():
        relative = "" if p.is_absolute() else f" (relative to {Path.cwd()})"
        raise RunError(
            f"{where} does not exist{relative}; give the path of a conversation JSONL or "
            "Parquet file (docs/datasets.md)"
        )
    if p.is_dir():
        raise RunError(
            f"{where} is a directory; give a conversation JSONL or Parquet file, or for a "
            "Hugging Face dataset directory set data.source={type: hf, path: DIR}"
        )
    try:
        with p.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise RunError(f"{where} cannot be read ({exc.strerror}); fix its permissions") from None


def eval_ref(cfg: RunConfig, value: str) -> DatasetRef:
    """What ``zbrl eval --data`` reads: a file, ``held_out`` (the held-out split of the config's
    training data: ``data.source``'s, or the embedded task's when the config trains on it) or
    ``embedded`` (the embedded task's held-out split, written on first use), as ``eval.sets``
    reads them. A RunError naming ``--data`` and the fix when the config's training data has no
    held-out split."""
    data = cfg.data
    where = f"--data {value}"
    if value == HELD_OUT and data.source is not None:
        if isinstance(data.source, HfSource) and data.source.eval_split is None:
            raise RunError(
                f"{where}: data.source has no eval_split; set data.source.eval_split to the "
                "split to evaluate on (e.g. data.source.eval_split=test), or give a "
                "conversation file (--data NAME=PATH)"
            )
        return SourceSplit(data.source, "eval")
    if value == EMBEDDED or (value == HELD_OUT and data.trains_on_embedded):
        return embedded_task_files(cfg)[1]
    if value == HELD_OUT:
        raise RunError(
            f"{where}: the config trains on data.train_path={data.train_path!r}, a file, which "
            "has no held-out split; give a conversation file (--data NAME=PATH), or "
            f"--data {EMBEDDED} for the embedded arithmetic task's held-out split"
        )
    return Path(value)


def load_set_examples(ref: DatasetRef | str, cfg: RunConfig) -> LoadReport:
    """Load and validate the examples of one set, checked against the reward's answer field."""
    answer = answer_spec(cfg)
    skip = cfg.data.skip_bad_lines
    if not isinstance(ref, SourceSplit):
        return load_examples(ref, answer_field=answer, skip_bad_lines=skip)
    source = ref.source
    if isinstance(source, HfSource):
        from zbrl.data.hf_source import load_hf_examples

        split = source.split if ref.split == "train" else source.eval_split
        assert split is not None  # the config checks refuse held_out without eval_split
        return load_hf_examples(
            source.path,
            name=source.name,
            split=split,
            answer=answer,
            prompt_column=source.columns.prompt,
            answer_column=source.columns.answer,
            skip_bad_lines=skip,
        )
    from zbrl.data.reasoning_gym_source import load_reasoning_gym_examples

    return load_reasoning_gym_examples(
        task_specs(source),
        split=ref.split,
        size=source.size,
        seed=source.seed,
        eval_size=source.eval_size,
        eval_seed=source.eval_seed,
        answer=answer,
    )


def task_specs(source: ReasoningGymSource) -> list[Any]:
    """The source's tasks as :class:`zbrl.rewards.reasoning_gym_tasks.TaskSpec`."""
    from zbrl.rewards.reasoning_gym_tasks import TaskSpec

    return [TaskSpec(t.name, t.weight, dict(t.config)) for t in source.tasks]


def check_data_source(cfg: RunConfig) -> None:
    """Fail early (before a run directory) when ``data.source`` cannot give data: a missing
    path, an unreachable hub, an unknown reasoning-gym task or option. Raises DatasetError or
    RunError; reads only what that takes (a reasoning-gym task builds one problem)."""
    source = cfg.data.source
    if isinstance(source, HfSource):
        from zbrl.data.hf_source import open_hf_split

        open_hf_split(source.path, split=source.split, name=source.name)
    elif isinstance(source, ReasoningGymSource):
        from zbrl.data.reasoning_gym_source import build_dataset

        build_dataset(task_specs(source), size=1, seed=source.seed)[0]


def encode_prompts(
    path: DatasetRef | str, cfg: RunConfig, tokenizer: Any, *, limit: int | None = None
) -> tuple[list[EncodedPrompt], dict[str, Any]]:
    """Load a dataset (a file or a source split) and apply the chat template; returns prompts
    and encoding stats."""
    from zbrl.types import EncodedPrompt

    report = load_set_examples(path, cfg)
    examples = report.examples[:limit] if limit else report.examples
    told = episode_tool_prompt(cfg, tokenizer)
    encoder = PromptEncoder(
        tokenizer,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        overlong=cfg.data.overlong_prompt,
        system_prompt=resolve_system_prompt(cfg.data.system_prompt, default_system_prompt(cfg)),
        tools=told.tools if told is not None else None,
        tool_section=told.system_section if told is not None else None,
    )
    encoded, stats = encoder.encode_all(examples)
    stats["skipped_lines"] = report.num_skipped
    prompts = [EncodedPrompt(ex.uid, list(ids), ex.to_example()) for ex, ids in encoded]
    return prompts, stats
