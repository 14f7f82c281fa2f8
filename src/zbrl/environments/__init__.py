"""Multi-turn episodes: the environment protocol, tool calls, built-in tools and the episode
runner that keeps every token as the policy saw and produced it (docs/environments.md)."""

from zbrl.environments.base import Environment, EnvTurn, Episode

__all__ = ["EnvTurn", "Environment", "Episode"]
