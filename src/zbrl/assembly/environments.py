"""The episode runner of a run, for a producer's or the evaluator's backend: multi-turn episodes
of the configured ``environment``, or single-turn ones (plain prompts) without one."""

from __future__ import annotations

from typing import Any

from zbrl.config import RunConfig


def build_episode_runner(cfg: RunConfig, backend: Any, max_new_tokens: int):
    """An :class:`~zbrl.rollout.episodes.EpisodeRunner` for ``backend`` (its tokenizer formats
    the environment's messages): the configured environment's episodes, or single-turn episodes
    within ``max_new_tokens`` (the sampling budget of the producer or evaluator it serves)
    without ``environment``."""
    from zbrl.rollout.single_turn import single_turn_episodes

    env_cfg = cfg.environment
    if env_cfg is None:  # which environment the config asks for; the rollout path is the same
        return single_turn_episodes(backend.tokenizer, max_new_tokens)
    from zbrl.config.environments import AgentEnvironment
    from zbrl.environments.build import build_environment
    from zbrl.rollout.agents.build import build_agent_environment
    from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
    from zbrl.rollout.transcripts import ChatTranscript
    from zbrl.rollout.turns import TurnFormatter

    tokenizer = backend.tokenizer
    eos_ids = set(getattr(backend, "eos_ids", None) or {tokenizer.eos_token_id})
    if isinstance(env_cfg, AgentEnvironment):  # the agent drives, through the endpoint
        environment = build_agent_environment(env_cfg, tokenizer, eos_ids)
        formatter = environment.endpoint.renderer.formatter  # the agent's messages, any role
    else:
        environment = build_environment(env_cfg)
        formatter = TurnFormatter(tokenizer, env_cfg.message_role, eos_ids=eos_ids)
    return EpisodeRunner(
        environment,
        ChatTranscript(formatter),
        EpisodeLimitSettings(
            max_turns=env_cfg.limits.max_turns,
            max_total_tokens=env_cfg.limits.max_total_tokens,
        ),
        score_final_turn=env_cfg.score_final_turn,
    )
