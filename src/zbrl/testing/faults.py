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
