"""The environment protocol: an episode starts from a dataset example, answers each model turn
with a message (or ends), and may add a reward per turn.

The episode runner (:mod:`zbrl.rollout.episodes`, which sits above this package and imports only
this protocol) owns the tokens: an environment sees and returns text only. It never renders the
conversation; the runner formats each message through the chat template once and appends its
tokens to the ones the policy generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class EnvTurn:
    """The environment's answer to one model turn."""

    message: str | None
    """The next message to the model; None ends the episode (the model's turn was final)."""
    reward: float = 0.0
    """Reward for this turn, added to the episode's reward (shaping; 0 for none)."""
    ans_acc: float | None = None
    """The episode's outcome as judged by the environment (1.0 solved, 0.0 not); used as the
    answer accuracy when the run's reward does not score the final turn."""
    info: dict[str, Any] = field(default_factory=dict)
    """Shown with the turn in the rollout log (tool calls and their results)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Events to count in the run's metrics as ``env/<name>`` (``tool_calls``, ``tool_errors``)."""


class EpisodeFailure(Exception):
    """Raised by an environment's ``start`` or ``step`` when the episode cannot go on through no
    fault of the model (its server died, did not answer in time, answered garbage): the episode
    fails and its group is dropped, never trained on a made-up score. Any other exception ends
    the episode as it stands (``env/env_errors``)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        """The event counted as ``env/<kind>`` (with ``env/env_failures``)."""
        self.detail = detail


class Episode(Protocol):
    """One episode's state. An episode may also have ``close()``, which the runner calls once
    when the episode has ended, however it ended (a limit, the environment, a failure)."""

    def step(self, model_text: str) -> EnvTurn:
        """The environment's answer to the model's turn (its decoded text)."""
        ...


class Environment(Protocol):
    """Makes episodes; built once per producer (and evaluator) with the config's ``options``."""

    def start(self, example: dict[str, Any]) -> Episode:
        """A new episode for a dataset example (``messages``, ``gt_answer``, ...)."""
        ...


def stop_strings_of(env: Environment) -> tuple[str, ...]:
    """Extra strings that end a model turn, when the environment declares ``stop_strings``."""
    return tuple(getattr(env, "stop_strings", ()))
