"""reasoning-gym tasks by their specs: the one place a task, or a weighted mix of tasks, is made
into a reasoning-gym dataset. The ``reasoning_gym`` reward builds its scorers here, with the same
specs as the data source (:mod:`zbrl.data.reasoning_gym_source`) built its problems, which checks
the specs and words their errors for the user."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskSpec:
    """One reasoning-gym task: its registered name, mixing weight and config options."""

    name: str
    weight: float = 1.0
    config: Mapping[str, Any] = field(default_factory=dict)


def create_dataset(tasks: Sequence[TaskSpec], *, size: int, seed: int) -> Any:
    """The reasoning-gym dataset of ``tasks``: the one task's, or reasoning-gym's composite of
    several (by weight). reasoning-gym's own errors propagate (a ``TypeError``, ``ValueError`` or
    ``AssertionError`` for a bad option, a ``KeyError`` for an unknown name)."""
    import reasoning_gym
    from reasoning_gym.composite import DatasetSpec

    if len(tasks) == 1:
        task = tasks[0]
        return reasoning_gym.create_dataset(task.name, **dict(task.config), size=size, seed=seed)
    specs = [DatasetSpec(t.name, t.weight, dict(t.config)) for t in tasks]
    return reasoning_gym.create_dataset("composite", size=size, seed=seed, datasets=specs)
