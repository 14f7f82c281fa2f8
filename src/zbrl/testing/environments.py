"""Environments for tests: importable by path in every worker process (``environment.type:
zbrl.testing.environments:Reply``)."""

from __future__ import annotations

from typing import Any

from zbrl.environments.base import EnvTurn


class Reply:
    """Answers every model turn with its length in characters, so that every episode runs to
    ``limits.max_turns`` whatever the model writes; the turn reward is ``reward_per_turn``. Its
    stop strings (digits and space) end an untrained model's turns early."""

    stop_strings = tuple("0123456789 ")

    def __init__(self, reward_per_turn: float = 0.0) -> None:
        self.reward_per_turn = reward_per_turn

    def start(self, example: dict[str, Any]) -> Reply:
        return self

    def step(self, model_text: str) -> EnvTurn:
        return EnvTurn(
            message=f"{len(model_text)} chars",
            reward=self.reward_per_turn,
            counts={"replies": 1},
        )
