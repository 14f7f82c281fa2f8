"""The episode runner of a run, for a producer's or the evaluator's backend: multi-turn episodes
of the configured ``environment``, or single-turn ones (plain prompts) without one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zbrl.config import RunConfig
from zbrl.config.environments import CalculatorTool, ToolsEnvironment


def build_episode_runner(cfg: RunConfig, backend: Any, max_new_tokens: int):
    """An :class:`~zbrl.rollout.episodes.EpisodeRunner` for ``backend`` (its tokenizer formats
    the environment's messages): the configured environment's episodes, or single-turn episodes
    within ``max_new_tokens`` (the sampling budget of the producer or evaluator it serves)
    without ``environment``."""
    from zbrl.rollout.single_turn import single_turn_episodes

    env_cfg = cfg.environment
    if env_cfg is None:  # which environment the config asks for; the rollout path is the same
        return single_turn_episodes(backend.tokenizer, max_new_tokens)
    from zbrl.environments.build import build_environment
    from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
    from zbrl.rollout.transcripts import ChatTranscript
    from zbrl.rollout.turns import TurnFormatter

    tokenizer = backend.tokenizer
    eos_ids = set(getattr(backend, "eos_ids", None) or {tokenizer.eos_token_id})
    return EpisodeRunner(
        build_environment(env_cfg),
        ChatTranscript(TurnFormatter(tokenizer, env_cfg.message_role, eos_ids=eos_ids)),
        EpisodeLimitSettings(
            max_turns=env_cfg.limits.max_turns,
            max_total_tokens=env_cfg.limits.max_total_tokens,
        ),
        score_final_turn=env_cfg.score_final_turn,
    )


def uses_tag_calculator(cfg: RunConfig) -> bool:
    """True when the run's environment offers a calculator in the ``tags`` format (the tool
    demo's setting: its task files and warm start then teach calculator traces)."""
    env = cfg.environment
    return (
        isinstance(env, ToolsEnvironment)
        and env.call_format == "tags"
        and any(isinstance(t, CalculatorTool) and t.tag == "calc" for t in env.tools)
    )


def demo_task_files(cfg: RunConfig, cache: Path) -> tuple[Path, Path]:
    """The multiplication task's train and held-out files (``data.synthetic.task``), cached."""
    from zbrl.environments.demo_task import write_task

    s, tools = cfg.data.synthetic, uses_tag_calculator(cfg)
    kind = "tools" if tools else "plain"
    directory = cache / f"task-multiply-{kind}-s{s.seed}-n{s.num_train}-e{s.num_eval}"
    train, held_out = directory / "train.jsonl", directory / "eval.jsonl"
    if not (train.is_file() and held_out.is_file()):
        write_task(directory, n_train=s.num_train, n_eval=s.num_eval, seed=s.seed, tools=tools)
    return train, held_out


def demo_warm_start(cfg: RunConfig, cache: Path, verbose: bool) -> Path:
    """The embedded model warm-started on the multiplication task's traces, cached."""
    from zbrl.environments.demo_warm_start import DemoWarmStartSettings, ensure_demo_warm_start

    ws = cfg.model.warm_start
    settings = DemoWarmStartSettings(
        tools=uses_tag_calculator(cfg),
        seed=cfg.seed,
        steps=ws.steps,
        stop_at_accuracy=ws.stop_at_accuracy,
        batch_size=ws.batch_size,
        lr=ws.lr,
    )
    return ensure_demo_warm_start(cache, settings, verbose=verbose)
