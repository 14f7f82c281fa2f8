"""Single-turn rollouts as the trivial episode: a plain prompt is an episode of
:class:`NoEnvironment`, run and scored by the same :class:`~zbrl.rollout.episodes.EpisodeRunner`
as a multi-turn one, with no environment turn."""

from __future__ import annotations

from typing import Any

from zbrl.environments.base import EnvTurn, Episode
from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
from zbrl.rollout.transcripts import ResponseTranscript


class _FirstTurnEnds:
    """An episode that ends with the model's first turn."""

    def step(self, model_text: str) -> EnvTurn:
        return EnvTurn(message=None)


class NoEnvironment:
    """The environment of a plain prompt: it answers no turn, so the model's first turn ends
    the episode."""

    def start(self, example: dict[str, Any]) -> Episode:
        return _FirstTurnEnds()


def single_turn_episodes(tokenizer: Any, max_new_tokens: int) -> EpisodeRunner:
    """The episode runner of plain prompts, within ``max_new_tokens`` (the sampling budget the
    run generates with; the reward's ``RewardContext.max_new_tokens``)."""
    return EpisodeRunner(
        NoEnvironment(),
        ResponseTranscript(tokenizer),
        EpisodeLimitSettings(max_turns=1, max_total_tokens=max_new_tokens),
    )
