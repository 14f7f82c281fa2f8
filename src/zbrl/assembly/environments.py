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
    from zbrl.config.environments import EndpointEnvironment
    from zbrl.environments.build import build_environment
    from zbrl.rollout.agents.build import build_agent_environment
    from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
    from zbrl.rollout.transcripts import ChatTranscript
    from zbrl.rollout.turns import TurnFormatter

    tokenizer = backend.tokenizer
    eos_ids = set(getattr(backend, "eos_ids", None) or {tokenizer.eos_token_id})
    if isinstance(env_cfg, EndpointEnvironment):  # the agent drives, through the endpoint
        environment = build_agent_environment(env_cfg, tokenizer, eos_ids, backend.context_len)
        formatter = environment.endpoint.renderer.formatter  # the agent's messages, any role
    else:
        environment = build_environment(env_cfg)
        told = tool_prompt_of(env_cfg, environment, tokenizer)
        formatter = TurnFormatter(
            tokenizer,
            env_cfg.message_role,
            eos_ids=eos_ids,
            tools=told.tools if told is not None else None,
        )
    return EpisodeRunner(
        environment,
        ChatTranscript(formatter),
        EpisodeLimitSettings(
            max_turns=env_cfg.limits.max_turns,
            max_total_tokens=env_cfg.limits.max_total_tokens,
        ),
        score_final_turn=env_cfg.score_final_turn,
    )


def check_environment(cfg: RunConfig) -> None:
    """Pre-flight: the configured environment builds (a user environment's or tool's import path
    and options), once, before anything is created; a RunError naming the field otherwise."""
    if cfg.environment is None:
        return
    from zbrl.config.environments import EndpointEnvironment

    if isinstance(cfg.environment, EndpointEnvironment):  # an agent, or a verifiers environment
        from zbrl.rollout.agents.build import build_agent

        build_agent(cfg.environment)
        return
    from zbrl.environments.build import build_environment

    build_environment(cfg.environment)


def check_episode_template(cfg: RunConfig, tokenizer: Any) -> None:
    """Pre-flight, once the run's tokenizer is loaded: its chat template renders an environment
    message in ``environment.message_role`` after an assistant turn, and renders it by adding
    text (prefix preservation), as every episode will need. A RunError naming the field and
    the fix otherwise (without it the producers would fail after the run directory exists)."""
    from zbrl.config.environments import EndpointEnvironment

    if cfg.environment is None or isinstance(cfg.environment, EndpointEnvironment):
        return  # an agent's messages are rendered by the endpoint, in the roles it chooses
    from zbrl.rollout.turns import TurnFormatter

    told = episode_tool_prompt(cfg, tokenizer)
    TurnFormatter(
        tokenizer,
        cfg.environment.message_role,
        eos_ids={tokenizer.eos_token_id},
        tools=told.tools if told is not None else None,
    )


def episode_tool_prompt(cfg: RunConfig, tokenizer: Any) -> Any:
    """How the run's prompts tell the model about its tools
    (:class:`zbrl.environments.tool_prompt.ToolPrompt`): None without a ``tools`` environment or
    with ``describe_tools: false``."""
    from zbrl.config.environments import ToolsEnvironment

    if not isinstance(cfg.environment, ToolsEnvironment):  # only the tools environment tells
        return None
    from zbrl.environments.build import build_environment

    return tool_prompt_of(cfg.environment, build_environment(cfg.environment), tokenizer)


def tool_prompt_of(env_cfg: Any, environment: Any, tokenizer: Any) -> Any:
    """The :class:`~zbrl.environments.tool_prompt.ToolPrompt` of a built environment: None
    unless it is the ``tools`` environment with ``describe_tools`` on."""
    from zbrl.config.environments import ToolsEnvironment

    if not isinstance(env_cfg, ToolsEnvironment) or not env_cfg.describe_tools:
        return None
    from zbrl.environments.tool_prompt import tool_prompt

    return tool_prompt(tokenizer, list(environment.tools.values()), env_cfg.call_format)
