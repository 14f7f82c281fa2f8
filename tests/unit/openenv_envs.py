"""OpenEnv environments for the openenv tests: a guessing game (multi-turn, a step budget), an
environment that refuses to be served concurrently, and a module that does not import.

``GuessEnv`` is reset with the secret (``target``); each action's ``message`` holds a guess
(its last integer); the observation says ``higher``/``lower`` (reward -0.1) or ends the episode
(reward 1.0 when right, 0 when the budget of guesses is spent). A message containing ``DIE``
kills the server process mid-episode.
"""

import os
import re

from openenv.core.env_server import Action, Environment, Observation, State

NUMBER = re.compile(r"-?\d+")


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    message: str = ""
    guesses_left: int = 0


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    BUDGET = 3

    def __init__(self):
        super().__init__()
        self._state = State()
        self.secret = 0
        self.left = self.BUDGET

    def reset(self, seed=None, episode_id=None, target: str = "0", **kwargs):
        self._state = State(episode_id=episode_id, step_count=0)
        self.secret, self.left = int(target), self.BUDGET
        return GuessObservation(message="Guess a number.", guesses_left=self.left)

    def step(self, action, timeout_s=None, **kwargs):
        if "DIE" in action.message:
            os._exit(3)
        self._state.step_count += 1
        self.left -= 1
        numbers = NUMBER.findall(action.message)
        guess = int(numbers[-1]) if numbers else None
        if guess == self.secret:
            return GuessObservation(message="right", done=True, reward=1.0)
        if self.left == 0:
            return GuessObservation(message="out of guesses", done=True, reward=0.0)
        hint = "higher" if guess is None or guess < self.secret else "lower"
        return GuessObservation(message=hint, reward=-0.1, guesses_left=self.left)

    @property
    def state(self):
        return self._state


class SingleSessionEnv(GuessEnv):
    SUPPORTS_CONCURRENT_SESSIONS = False


class Untyped(Environment):
    """An environment that does not say its action and observation classes."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation()

    def step(self, action, timeout_s=None, **kwargs):
        return Observation(done=True)

    @property
    def state(self):
        return State()


def hint_and_budget(observation):
    """A render function: the hint and the guesses left."""
    return f"{observation['message']} ({observation['guesses_left']} left)"
