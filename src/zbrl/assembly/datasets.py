"""The run's datasets: which data each set reads (a file or a split of ``data.source``), loading
and validating it, and encoding the prompts with the run's reward and data settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

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


def dataset_refs(
    cfg: RunConfig, task_train: Path | None, task_eval: Path | None
) -> tuple[DatasetRef, dict[str, DatasetRef]]:
    """What the training set and each eval set read (the embedded task's files when given)."""
    source = cfg.data.source
    if source is not None:
        train: DatasetRef = SourceSplit(source, "train")
    elif cfg.data.trains_on_embedded:
        assert task_train is not None
        train = task_train
    else:
        train = _existing(cfg.data.train_path)
    evals: dict[str, DatasetRef] = {}
    for name, value in cfg.eval.sets.items():
        if value == HELD_OUT and source is not None:
            evals[name] = SourceSplit(source, "eval")
        elif value in (HELD_OUT, EMBEDDED):  # held_out of the embedded task: its eval split
            assert task_eval is not None
            evals[name] = task_eval
        else:
            evals[name] = _existing(value)
    return train, evals


def eval_ref(cfg: RunConfig, value: str) -> DatasetRef:
    """What ``zbrl eval --data`` reads: a file, or ``held_out`` (the source's eval split)."""
    if value == HELD_OUT:
        if cfg.data.source is None:
            raise FileNotFoundError(
                f"--data {HELD_OUT}: the recipe has no data.source to take a held-out split "
                "from; give a conversation file"
            )
        return SourceSplit(cfg.data.source, "eval")
    return Path(value)


def _existing(path: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"dataset {path!r} does not exist")
    return p


def load_set_examples(ref: DatasetRef | str, cfg: RunConfig) -> LoadReport:
    """Load and validate the examples of one set, checked against the reward's answer field."""
    answer = answer_spec(cfg)
    skip = cfg.data.skip_bad_lines
    if not isinstance(ref, SourceSplit):
        return load_examples(ref, answer_field=answer.field, skip_bad_lines=skip)
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
    encoder = PromptEncoder(
        tokenizer,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        overlong=cfg.data.overlong_prompt,
        system_prompt=resolve_system_prompt(cfg.data.system_prompt, default_system_prompt(cfg)),
    )
    encoded, stats = encoder.encode_all(examples)
    stats["skipped_lines"] = report.num_skipped
    prompts = [EncodedPrompt(ex.uid, list(ids), ex.to_example()) for ex, ids in encoded]
    return prompts, stats
