"""Typed run configuration (pydantic v2). Imports no torch, ray or transformers."""

from zbrl.config.algorithm import (
    AdvantageConfig,
    AlgorithmConfig,
    CriticConfig,
    DrGrpoAdvantage,
    GaeAdvantage,
    GrpoAdvantage,
    GspoLoss,
    ImportAdvantage,
    ImportPolicyLoss,
    LrScheduleConfig,
    PolicyLossConfig,
    PpoClipLoss,
    ReinforcePPAdvantage,
    RlooAdvantage,
)
from zbrl.config.data import DataConfig, SyntheticTaskConfig
from zbrl.config.evaluation import EvalConfig
from zbrl.config.launch import LaunchConfig, ParallelConfig
from zbrl.config.loader import (
    ConfigError,
    apply_overrides,
    build_config,
    load_config,
    read_recipe,
    resolved_yaml,
)
from zbrl.config.logging import LoggingConfig
from zbrl.config.model import EMBEDDED, ModelConfig, WarmStartConfig
from zbrl.config.presets import PRESETS
from zbrl.config.rewards import (
    BoxedReward,
    CodeReward,
    ExtraReward,
    LengthShapingOptions,
    MathRewardOptions,
    RewardConfig,
    SandboxConfig,
    ThinkAnswerTagsReward,
    UserReward,
)
from zbrl.config.rollout import GenerationConfig, RolloutConfig, TemperatureSchedule
from zbrl.config.run import RunConfig
from zbrl.config.training import TrainingConfig
from zbrl.config.transport import ObjectStoreSync, TransportConfig

__all__ = [
    "EMBEDDED",
    "PRESETS",
    "AdvantageConfig",
    "AlgorithmConfig",
    "BoxedReward",
    "CodeReward",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "DrGrpoAdvantage",
    "EvalConfig",
    "ExtraReward",
    "GaeAdvantage",
    "GenerationConfig",
    "GrpoAdvantage",
    "GspoLoss",
    "ImportAdvantage",
    "ImportPolicyLoss",
    "LaunchConfig",
    "LengthShapingOptions",
    "LoggingConfig",
    "LrScheduleConfig",
    "MathRewardOptions",
    "ModelConfig",
    "ObjectStoreSync",
    "ParallelConfig",
    "PolicyLossConfig",
    "PpoClipLoss",
    "ReinforcePPAdvantage",
    "RewardConfig",
    "RlooAdvantage",
    "RolloutConfig",
    "RunConfig",
    "SandboxConfig",
    "SyntheticTaskConfig",
    "TemperatureSchedule",
    "ThinkAnswerTagsReward",
    "TrainingConfig",
    "TransportConfig",
    "UserReward",
    "WarmStartConfig",
    "apply_overrides",
    "build_config",
    "load_config",
    "read_recipe",
    "resolved_yaml",
]
