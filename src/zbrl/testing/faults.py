"""Fault injection: reward functions that fail, for testing that a run surfaces worker errors.

Use as ``reward.type=zbrl.testing.faults:failing_reward``; the producer that scores with it
raises, and the driver must end the run with a message naming that producer.
"""

from __future__ import annotations

from typing import Any


class InjectedFault(RuntimeError):
    """Raised on purpose by the fault-injection helpers."""


def failing_reward(response: str, example: Any, ctx: Any) -> float:
    raise InjectedFault("injected producer failure (zbrl.testing.faults:failing_reward)")


def sleeping_reward(response: str, example: Any, ctx: Any, *, sleep_s: float = 3600.0) -> float:
    """A reward that hangs (``sleep_s``), for testing the user-reward deadline."""
    import time

    time.sleep(sleep_s)
    return 1.0


def options_reward(response: str, example: Any, ctx: Any, *, bonus: float = 0.0) -> float:
    """A reward whose value is its ``bonus`` option, for testing that options reach the user."""
    return bonus


def failing_on_rank1_advantage(rewards_BG: Any, **kwargs: Any) -> Any:
    """GRPO advantages, except on data-parallel consumer rank 1, which raises: for testing that
    a consumer failing mid-step ends the run (its peers wait in a collective) with its name.
    Use as ``algorithm.advantage=zbrl.testing.faults:failing_on_rank1_advantage``."""
    import torch.distributed as dist

    from zbrl.algorithms.advantages import grpo

    if dist.is_initialized() and dist.get_rank() == 1:
        raise InjectedFault("injected consumer failure on rank 1")
    return grpo(rewards_BG)
