"""What a run needs on disk before workers start: the model directory and the dataset files.

The embedded default (docs/embedded-default.md: its task files, warm-started model and reward
model, cached under ``logging.cache_dir``) comes from :mod:`zbrl.assembly.embedded`; any other
``model.path`` is resolved to a local directory here (:mod:`zbrl.models.sources`), so workers
only see local paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zbrl.assembly.datasets import DatasetRef, dataset_refs, needs_embedded_task
from zbrl.assembly.embedded import (
    embedded_policy_dir,
    embedded_reward_model_dir,
    embedded_task_files,
    uses_embedded_reward_model,
)
from zbrl.assembly.model_source import user_model_dir, user_tokenizer_dir
from zbrl.config import EMBEDDED, RunConfig
from zbrl.models.quiet import quiet_transformers


@dataclass(frozen=True)
class Artifacts:
    model_dir: Path
    tokenizer_dir: Path
    train_path: DatasetRef
    eval_paths: dict[str, DatasetRef]


def prepare_artifacts(cfg: RunConfig, *, verbose: bool = True) -> Artifacts:
    task_train = task_eval = None
    if needs_embedded_task(cfg):
        task_train, task_eval = embedded_task_files(cfg)
    model_dir = _model_dir(cfg, verbose)
    if uses_embedded_reward_model(cfg):  # trained on the warm-started policy's answers, cached
        embedded_reward_model_dir(cfg, verbose=verbose)
    if cfg.model.tokenizer_path is not None:
        quiet_transformers()
    tokenizer_dir = user_tokenizer_dir(cfg, verbose=verbose) or model_dir
    train, evals = dataset_refs(cfg, task_train, task_eval)
    return Artifacts(model_dir, tokenizer_dir, train, evals)


def _model_dir(cfg: RunConfig, verbose: bool) -> Path:
    if cfg.model.path != EMBEDDED:  # a local directory, a GGUF file, a Hub id, a pulled name
        quiet_transformers()
        return user_model_dir(cfg, verbose=verbose)
    return embedded_policy_dir(cfg, verbose=verbose)
