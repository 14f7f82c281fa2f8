"""What a run needs on disk before workers start: the model directory and the dataset files,
built once: the pre-flight (``zbrl.launch.preflight``) opens the user's model, tokenizer and
dataset files into :class:`RunSources`, and :func:`prepare_artifacts` builds the rest from them.

The embedded default (docs/embedded-default.md: its task files, warm-started model and reward
model, cached under ``logging.cache_dir``) comes from :mod:`zbrl.assembly.embedded`; any other
``model.path`` is resolved to a local directory here (:mod:`zbrl.models.sources`), so workers
only see local paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zbrl.assembly.datasets import DatasetRef, DatasetRefs, needs_embedded_task, open_dataset_refs
from zbrl.assembly.embedded import (
    embedded_policy_dir,
    embedded_reward_model_dir,
    embedded_task_files,
    uses_embedded_reward_model,
)
from zbrl.assembly.model_source import OpenedModel, resolve_model_source
from zbrl.config import RunConfig


@dataclass(frozen=True)
class Artifacts:
    model_dir: Path
    tokenizer_dir: Path
    train_path: DatasetRef
    eval_paths: dict[str, DatasetRef]


@dataclass(frozen=True)
class RunSources:
    """What the pre-flight opened (the first half of the build), kept for the build."""

    model: OpenedModel
    """The model and tokenizer directories and the tokenizer (None parts: the embedded model)."""
    datasets: DatasetRefs
    """What each set reads (None: the embedded task's files)."""


def prepare_artifacts(
    cfg: RunConfig, sources: RunSources | None = None, *, verbose: bool = True
) -> Artifacts:
    """The second half of the build: the embedded default's files (task, warm start, reward
    model) built or found, and every set's reference. ``sources``: what the pre-flight opened
    (None: the model's directories resolved and the dataset files checked here; the tokenizer is
    then loaded where prompts are encoded)."""
    if sources is None:
        sources = RunSources(resolve_model_source(cfg, verbose=verbose), open_dataset_refs(cfg))
    task_train = task_eval = None
    if needs_embedded_task(cfg):
        task_train, task_eval = embedded_task_files(cfg)
    model_dir = sources.model.model_dir
    if model_dir is None:  # the embedded model
        model_dir = embedded_policy_dir(cfg, verbose=verbose)
    if uses_embedded_reward_model(cfg):  # trained on the warm-started policy's answers, cached
        embedded_reward_model_dir(cfg, verbose=verbose)
    tokenizer_dir = sources.model.tokenizer_dir or model_dir
    if cfg.algorithm.distill is not None:  # built or fetched here; refused unless it shares
        from zbrl.assembly.teacher import check_same_tokenizer, teacher_dir  # the tokenizer

        check_same_tokenizer(teacher_dir(cfg, verbose=verbose), tokenizer_dir)
    train, evals = sources.datasets.with_task_files(task_train, task_eval)
    return Artifacts(model_dir, tokenizer_dir, train, evals)
