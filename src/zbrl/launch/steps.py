"""The steps a run makes: ``training.max_steps``, capped by what ``data.num_epochs`` passes over
the prompts give, and the line that says so when the cap bites."""

from __future__ import annotations

import math

from zbrl.config import RunConfig


def planned_steps(cfg: RunConfig, num_prompts: int) -> int:
    """The steps the run makes: ``training.max_steps``, capped by what ``data.num_epochs`` of the
    prompts give (every step takes ``train_batch_size`` of them)."""
    return max(1, min(cfg.training.max_steps or math.inf, data_steps(cfg, num_prompts)))


def data_steps(cfg: RunConfig, num_prompts: int) -> int:
    return math.ceil(num_prompts * cfg.data.num_epochs / cfg.training.train_batch_size)


def epochs_for_steps(cfg: RunConfig, num_prompts: int, steps: int) -> int:
    """``data.num_epochs``, raised where needed so that the data gives ``steps`` steps."""
    need = math.ceil(steps * cfg.training.train_batch_size / max(1, num_prompts))
    return max(cfg.data.num_epochs, need)


def steps_notice(cfg: RunConfig, num_prompts: int) -> str | None:
    """A line saying that ``training.max_steps`` asks for more steps than the data gives (the run
    then ends when the prompts run out), or None."""
    wanted, given = cfg.training.max_steps, data_steps(cfg, num_prompts)
    if wanted is None or wanted <= given:
        return None
    epochs = epochs_for_steps(cfg, num_prompts, wanted)
    return (
        f"[zbrl] training.max_steps={wanted} is more than the data gives: {num_prompts} prompts x "
        f"data.num_epochs={cfg.data.num_epochs} / training.train_batch_size="
        f"{cfg.training.train_batch_size} = {given} steps, where the run will end "
        f"(data.num_epochs={epochs} gives {wanted})"
    )
