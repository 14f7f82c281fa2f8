"""Multi-turn episodes' environments: the environment protocol, tool calls, built-in tools and
environments (docs/environments.md). The episode runner that keeps every token as the policy saw
and produced it is :mod:`zbrl.rollout.episodes`."""

from zbrl.environments.base import Environment, EnvTurn, Episode, EpisodeFailure

__all__ = ["EnvTurn", "Environment", "Episode", "EpisodeFailure"]
