"""The embedded default's files in a cache directory, each built once and then found: a task's
train and held-out JSONL files, the warm-started tiny policy, and the reward model trained on that
policy's answers. Plain arguments in, directories out; :mod:`zbrl.assembly.embedded` reads them
from a RunConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from zbrl.embedded.warm_start import WarmStartSettings

Task = Literal["addition", "multiplication"]
"""``data.synthetic.task``: the demo's addition task, or the tool demo's multiplication."""


def task_files(
    cache: Path, task: Task, *, tools: bool, seed: int, num_train: int, num_eval: int
) -> tuple[Path, Path]:
    """The task's ``train.jsonl`` and ``eval.jsonl`` (held out) under ``cache``, written on
    first use. ``tools``: the multiplication task's rows ask for the calculator."""
    if task == "multiplication":
        from zbrl.embedded import multiplication_task

        kind = "tools" if tools else "plain"
        directory = cache / f"task-multiply-{kind}-s{seed}-n{num_train}-e{num_eval}"
        train, held_out = directory / "train.jsonl", directory / "eval.jsonl"
        if not (train.is_file() and held_out.is_file()):
            multiplication_task.write_task(
                directory, n_train=num_train, n_eval=num_eval, seed=seed, tools=tools
            )
        return train, held_out
    from zbrl.embedded import addition_task

    directory = cache / f"task-s{seed}-n{num_train}-e{num_eval}"
    train, held_out = directory / "train.jsonl", directory / "eval.jsonl"
    if not (train.is_file() and held_out.is_file()):
        addition_task.write_task(directory, n_train=num_train, n_eval=num_eval, seed=seed)
    return train, held_out


def warm_started_policy(
    cache: Path, task: Task, settings: WarmStartSettings, *, tools: bool, verbose: bool = True
) -> Path:
    """The tiny policy warm-started on ``task`` (with the calculator's traces when ``tools``),
    trained on first use and cached (:func:`zbrl.embedded.warm_start.ensure_warm_start`)."""
    from zbrl.embedded.warm_start import ensure_warm_start
    from zbrl.embedded.warm_start_tasks import AdditionWarmStart, MultiplicationWarmStart

    if task == "multiplication":
        return ensure_warm_start(cache, MultiplicationWarmStart(tools), settings, verbose=verbose)
    return ensure_warm_start(cache, AdditionWarmStart(), settings, verbose=verbose)


def reward_model(cache: Path, policy_dir: Path, *, seed: int, verbose: bool = True) -> Path:
    """The embedded reward model trained on the sampled answers of the addition policy in
    ``policy_dir``, trained on first use and cached
    (:func:`zbrl.embedded.reward_model.ensure_reward_model`)."""
    from zbrl.embedded.reward_model import ensure_reward_model

    return ensure_reward_model(cache, policy_dir, seed=seed, verbose=verbose)
