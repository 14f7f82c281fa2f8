"""Reward functions: ``think_answer_tags``, ``boxed``, and, imported on first use,
``last_number``, ``reasoning_gym`` and ``code``; the answer extractions, the registry, length
shaping and weighted combinations. See ``docs/rewards.md``.

Importing this package imports neither ray nor torch (nor math_verify or reasoning_gym, loaded on
first use).
"""

from zbrl.rewards.answer_check import answers_equivalent
from zbrl.rewards.base import BaseReward, Example, RewardContext, RewardFunction, RewardResult
from zbrl.rewards.boxed import BoxedReward
from zbrl.rewards.combine import CombinedReward
from zbrl.rewards.deadline import DeadlineExceeded, run_with_deadline
from zbrl.rewards.length import LengthShaping
from zbrl.rewards.math_reward import MathAnswerReward
from zbrl.rewards.registry import (
    REWARDS,
    FunctionReward,
    UserRewardError,
    build_reward,
    build_user_reward,
    known_rewards,
    register_reward,
)
from zbrl.rewards.think_answer import ThinkAnswerReward

__all__ = [
    "REWARDS",
    "BaseReward",
    "BoxedReward",
    "CombinedReward",
    "DeadlineExceeded",
    "Example",
    "FunctionReward",
    "LengthShaping",
    "MathAnswerReward",
    "RewardContext",
    "RewardFunction",
    "RewardResult",
    "ThinkAnswerReward",
    "UserRewardError",
    "answers_equivalent",
    "build_reward",
    "build_user_reward",
    "known_rewards",
    "register_reward",
    "run_with_deadline",
]
