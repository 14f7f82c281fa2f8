"""What a run needs on disk before workers start: the model directory and the dataset files.

The embedded default (docs/embedded-default.md) is built here: the synthetic task's JSONL files
and the warm-started tiny model, both cached under ``logging.cache_dir``; any other
``model.path`` is resolved to a local directory here (:mod:`zbrl.models.sources`), so workers
only see local paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zbrl.assembly.datasets import DatasetRef, dataset_refs, needs_embedded_task
from zbrl.assembly.model_source import user_model_dir, user_tokenizer_dir
from zbrl.config import EMBEDDED, RunConfig


@dataclass(frozen=True)
class Artifacts:
    model_dir: Path
    tokenizer_dir: Path
    train_path: DatasetRef
    eval_paths: dict[str, DatasetRef]


def prepare_artifacts(cfg: RunConfig, *, verbose: bool = True) -> Artifacts:
    cache = Path(cfg.logging.cache_dir)
    task_train = task_eval = None
    uses_task = needs_embedded_task(cfg)
    if uses_task:
        task_train, task_eval = _embedded_task(cfg, cache)
    model_dir = _model_dir(cfg, cache, verbose)
    if _embedded_reward_model(cfg):  # trained on the warm-started policy's answers, cached
        from zbrl.assembly.rewards import embedded_reward_model

        embedded_reward_model(cfg, verbose=verbose)
    if cfg.model.tokenizer_path is not None:
        from zbrl.models.quiet import quiet_transformers

        quiet_transformers()
    tokenizer_dir = user_tokenizer_dir(cfg, verbose=verbose) or model_dir
    train, evals = dataset_refs(cfg, task_train, task_eval)
    return Artifacts(model_dir, tokenizer_dir, train, evals)


def _embedded_task(cfg: RunConfig, cache: Path) -> tuple[Path, Path]:
    from zbrl.data.synthetic import write_task

    s = cfg.data.synthetic
    if s.task == "multiplication":  # the tool demo's task (zbrl.assembly.environments)
        from zbrl.assembly.environments import demo_task_files

        return demo_task_files(cfg, cache)
    directory = cache / f"task-s{s.seed}-n{s.num_train}-e{s.num_eval}"
    train, held_out = directory / "train.jsonl", directory / "eval.jsonl"
    if not (train.is_file() and held_out.is_file()):
        write_task(directory, n_train=s.num_train, n_eval=s.num_eval, seed=s.seed)
    return train, held_out


def _embedded_reward_model(cfg: RunConfig) -> bool:
    return cfg.reward.type == "reward_model" and getattr(cfg.reward, "path", None) == EMBEDDED


def embedded_policy_dir(cfg: RunConfig, cache: Path, *, verbose: bool = True) -> Path:
    """The warm-started embedded policy (cached: built once, then found)."""
    return _model_dir(cfg, cache, verbose)


def _model_dir(cfg: RunConfig, cache: Path, verbose: bool) -> Path:
    from zbrl.models.quiet import quiet_transformers

    if cfg.model.path != EMBEDDED:  # a local directory, a GGUF file, a Hub id, a pulled name
        quiet_transformers()
        return user_model_dir(cfg, verbose=verbose)
    if cfg.data.synthetic.task == "multiplication":
        from zbrl.assembly.environments import demo_warm_start

        quiet_transformers()
        return demo_warm_start(cfg, cache, verbose)
    from zbrl.models.warm_start import ensure_warm_start

    ws = cfg.model.warm_start
    return ensure_warm_start(
        cache,
        seed=cfg.seed,
        steps=ws.steps,
        stop_at_accuracy=ws.stop_at_accuracy,
        batch_size=ws.batch_size,
        lr=ws.lr,
        verbose=verbose,
    )


def _existing(path: str, what: str = "dataset") -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} {path!r} does not exist")
    return p
