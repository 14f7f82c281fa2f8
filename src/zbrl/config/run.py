"""The root configuration of one run."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from zbrl.config.algorithm import AlgorithmConfig
from zbrl.config.base import Section
from zbrl.config.checks import RUN_CHECKS
from zbrl.config.data import DataConfig
from zbrl.config.environments import EnvironmentConfig, environment_shorthand
from zbrl.config.evaluation import EvalConfig
from zbrl.config.launch import LaunchConfig
from zbrl.config.logging import LoggingConfig
from zbrl.config.model import ModelConfig
from zbrl.config.plugin import as_plugin_dict
from zbrl.config.presets import expand_preset
from zbrl.config.rewards import LengthShapingOptions, RewardConfig, ThinkAnswerTagsReward
from zbrl.config.rollout import RolloutConfig
from zbrl.config.training import TrainingConfig
from zbrl.config.transport import TransportConfig


class RunConfig(Section):
    """One RL run: every section, validated together."""

    name: str = Field(default="zbrl", min_length=1)
    """Run name (used in ``logging.run_dir``)."""
    seed: int = 0
    """Global seed (sampling, shuffling and initialisation derive from it and section seeds)."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy model."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Training prompts."""
    reward: RewardConfig = Field(default_factory=ThinkAnswerTagsReward)
    """The reward (``type``: think_answer_tags, boxed, last_number, reasoning_gym, code; a learned
    or remote one: reward_model, llm_judge, http; or ``package.module:function``) with its own
    options."""
    environment: EnvironmentConfig | None = None
    """Multi-turn episodes (``type``: tools or ``package.module:Class``, see
    docs/environments.md); None: single-turn responses."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Generation."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Update rule."""
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    """Training loop."""
    transport: TransportConfig = Field(default_factory=TransportConfig)
    """Rollout buffer and weight sync."""
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    """Workers and placement."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Outputs."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Held-out evaluation."""

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        return expand_preset(data) if isinstance(data, dict) else data

    @field_validator("reward", mode="before")
    @classmethod
    def _reward_shorthand(cls, value: Any) -> Any:
        return as_plugin_dict(value, ThinkAnswerTagsReward)

    @field_validator("environment", mode="before")
    @classmethod
    def _environment_shorthand(cls, value: Any) -> Any:
        return environment_shorthand(value)

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        for check in RUN_CHECKS:
            check(self)
        return self

    # Derived values: computed from fields, never stored twice.

    @property
    def run_dir(self) -> str:
        return self.logging.run_dir.replace("{name}", self.name)

    @property
    def cache_length(self) -> int:
        budget = self.rollout.generation.max_new_tokens
        if isinstance(self.reward, LengthShapingOptions) and self.reward.cache_length is not None:
            return self.reward.cache_length
        return max(1, min(1024, budget // 4))

    @property
    def minibatch_size(self) -> int:
        return self.training.train_minibatch_size or self.training.train_batch_size

    @property
    def eval_max_new_tokens(self) -> int:
        return self.eval.max_new_tokens or self.rollout.generation.max_new_tokens
