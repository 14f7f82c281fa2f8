"""An OpenEnv environment for the OpenEnv demo (recipes/demo_openenv.yaml, docs/environments.md):
the embedded addition task with two attempts.

zbrl serves ``AdditionEnv`` with OpenEnv's own server and plays each episode as one session:
``reset(target=...)`` with the sample's ``gt_answer`` (``environment.reset_fields``), then each
model turn is an ``AnswerAction`` whose ``message`` is the turn's text. A right
``<answer>…</answer>`` ends the episode with reward 1.0 on the first attempt and 0.5 on the
second; a wrong one is answered ``Wrong, try again.`` (the next user message, the observation's
``message``) until the attempts are spent (reward 0).
"""

from __future__ import annotations

import re
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class AnswerAction(Action):
    message: str
    """The model's turn."""


class FeedbackObservation(Observation):
    message: str = ""
    """What the model is told next."""


class AdditionEnv(Environment[AnswerAction, FeedbackObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own instance and no shared state
    ATTEMPTS = 2
    REWARDS = (1.0, 0.5)

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.target = ""

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, target: str = "", **kw: Any
    ) -> FeedbackObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self.target = target.strip()
        return FeedbackObservation(message="")

    def step(self, action: AnswerAction, timeout_s: float | None = None, **kw: Any):
        self._state.step_count += 1
        attempt = self._state.step_count
        found = ANSWER.findall(action.message)
        if found and found[-1].strip() == self.target:
            return FeedbackObservation(message="", done=True, reward=self.REWARDS[attempt - 1])
        if attempt >= self.ATTEMPTS:
            return FeedbackObservation(message="", done=True, reward=0.0)
        return FeedbackObservation(message="Wrong, try again.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state
