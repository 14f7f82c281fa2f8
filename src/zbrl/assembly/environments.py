"""The episode runner of a multi-turn run (``environment`` set), around a producer's or the
evaluator's backend; None for single-turn runs."""

from __future__ import annotations

from typing import Any

from zbrl.config import RunConfig


def build_episode_runner(cfg: RunConfig, backend: Any):
    """An :class:`~zbrl.environments.runner.EpisodeRunner` on ``backend`` (its tokenizer formats
    the environment's messages), or None without ``environment``."""
    env_cfg = cfg.environment
    if env_cfg is None:
        return None
    from zbrl.environments.build import build_environment
    from zbrl.environments.runner import EpisodeLimitSettings, EpisodeRunner
    from zbrl.environments.turns import TurnFormatter

    tokenizer = backend.tokenizer
    eos_ids = set(getattr(backend, "eos_ids", None) or {tokenizer.eos_token_id})
    return EpisodeRunner(
        backend,
        build_environment(env_cfg),
        TurnFormatter(tokenizer, env_cfg.message_role, eos_ids=eos_ids),
        EpisodeLimitSettings(
            max_turns=env_cfg.limits.max_turns,
            max_total_tokens=env_cfg.limits.max_total_tokens,
        ),
        score_final_turn=env_cfg.score_final_turn,
    )
