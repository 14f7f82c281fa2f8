"""Where prompts come from and how they become model inputs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from zbrl.config.base import Section
from zbrl.config.model import EMBEDDED


class SyntheticTaskConfig(Section):
    """The embedded arithmetic task used when ``data.train_path`` is ``embedded``."""

    num_train: int = Field(default=4000, ge=1)
    """Training problems generated."""
    num_eval: int = Field(default=200, ge=1)
    """Held-out problems (disjoint from the training problems)."""
    seed: int = 1234
    """Seed of the problem generator."""


class DataConfig(Section):
    """The training prompts and their encoding."""

    train_path: str = EMBEDDED
    """Conversation JSONL or Parquet file, or ``embedded`` for the synthetic arithmetic task."""
    system_prompt: str | None = None
    """System prompt added to conversations without one; None uses the reward type's default."""
    max_prompt_tokens: int = Field(default=512, ge=1)
    """Longest prompt (chat template applied) that is kept."""
    overlong_prompt: Literal["drop", "left_truncate"] = "drop"
    """Over-long prompts are dropped and counted, or left-truncated (never right-truncated)."""
    skip_bad_lines: bool = False
    """Skip invalid dataset lines (and report how many) instead of stopping with an error."""
    shuffle: bool = True
    """Reshuffle the prompts every epoch (deterministically from ``seed``)."""
    seed: int = 42
    """Seed of the prompt sampler."""
    num_epochs: int = Field(default=1, ge=1)
    """Passes over the training prompts."""
    max_prompts: int | None = Field(default=None, ge=1)
    """Use only the first N prompts of the dataset (quick runs); None uses all."""
    synthetic: SyntheticTaskConfig = Field(default_factory=SyntheticTaskConfig)
    """Settings of the embedded task."""
