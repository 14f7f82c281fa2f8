"""The embedded default (docs/embedded-default.md) from a RunConfig: which of its task files,
warm-started policy and reward model the run needs, built once under ``logging.cache_dir``
(:mod:`zbrl.embedded.artifacts`) and then found. The bottom of :mod:`zbrl.assembly`: it imports
only the config and :mod:`zbrl.embedded`, so the modules that need the embedded default
(artifacts, rewards) share it without importing each other."""

from __future__ import annotations

from pathlib import Path

from zbrl.config import EMBEDDED, RewardModelReward, RunConfig
from zbrl.config.environments import CalculatorTool, EndpointEnvironment, ToolsEnvironment
from zbrl.errors import RunError


def uses_tag_calculator(cfg: RunConfig) -> bool:
    """True when the run's environment offers a calculator in the ``tags`` format (the tool
    demo's setting: its task files and warm start then teach calculator traces), or its agent
    calls one that way (``environment.embedded_tools=calculator``)."""
    env = cfg.environment
    if isinstance(env, EndpointEnvironment):
        return env.embedded_tools == "calculator"
    return (
        isinstance(env, ToolsEnvironment)
        and env.call_format == "tags"
        and any(isinstance(t, CalculatorTool) and t.tag == "calc" for t in env.tools)
    )


def embedded_task_files(cfg: RunConfig) -> tuple[Path, Path]:
    """The train and held-out files of ``data.synthetic.task``, written on first use."""
    from zbrl.embedded.artifacts import task_files

    s = cfg.data.synthetic
    return task_files(
        Path(cfg.logging.cache_dir),
        s.task,
        tools=uses_tag_calculator(cfg),
        seed=s.seed,
        num_train=s.num_train,
        num_eval=s.num_eval,
    )


def embedded_policy_dir(cfg: RunConfig, *, verbose: bool = True) -> Path:
    """The warm-started embedded policy of ``data.synthetic.task`` (cached: built once, then
    found)."""
    return _warm_started(cfg, cfg.model.warm_start, verbose=verbose)


def embedded_teacher_dir(cfg: RunConfig, *, verbose: bool = True) -> Path:
    """``algorithm.distill.teacher=embedded``: the embedded model of the same task, trained by
    the warm-start builder with ``algorithm.distill.teacher_warm_start`` (by default further
    than the student, without the early stop), cached the same way."""
    distill = cfg.algorithm.distill
    if distill is None:
        raise ValueError("embedded_teacher_dir: the config has no algorithm.distill")
    return _warm_started(cfg, distill.teacher_warm_start, verbose=verbose)


def _warm_started(cfg: RunConfig, ws, *, verbose: bool) -> Path:
    from zbrl.embedded.artifacts import warm_started_policy
    from zbrl.embedded.warm_start import WarmStartSettings

    settings = WarmStartSettings(
        seed=cfg.seed,
        steps=ws.steps,
        stop_at_accuracy=ws.stop_at_accuracy,
        batch_size=ws.batch_size,
        lr=ws.lr,
    )
    return warm_started_policy(
        Path(cfg.logging.cache_dir),
        cfg.data.synthetic.task,
        settings,
        tools=uses_tag_calculator(cfg),
        verbose=verbose,
    )


def uses_embedded_reward_model(cfg: RunConfig) -> bool:
    """True for ``reward.type=reward_model`` with ``reward.path=embedded``."""
    return isinstance(cfg.reward, RewardModelReward) and cfg.reward.path == EMBEDDED


def check_embedded_reward_model(cfg: RunConfig) -> None:
    """``reward.path=embedded`` names a reward model this run can have: a RunError naming the
    field and the fix otherwise."""
    if not isinstance(cfg.reward, RewardModelReward):
        raise RunError(
            "reward.path: 'embedded' names the embedded reward model, which only "
            "reward.type=reward_model has; give the judge's model directory or hub id"
        )
    if cfg.model.path != EMBEDDED or cfg.data.synthetic.task != "addition":
        raise RunError(
            "reward.path='embedded': the embedded reward model is trained on the embedded "
            "policy's answers to the addition task (model.path=embedded, "
            "data.synthetic.task=addition); give a reward model directory or hub id instead"
        )


def embedded_reward_model_dir(cfg: RunConfig, *, verbose: bool = True) -> Path:
    """The embedded reward model's directory, trained on the warm-started policy's sampled
    answers and cached; the driver builds it with the run's artifacts, the workers find it in
    the cache."""
    from zbrl.embedded.artifacts import reward_model

    check_embedded_reward_model(cfg)
    policy = embedded_policy_dir(cfg, verbose=verbose)
    return reward_model(Path(cfg.logging.cache_dir), policy, seed=cfg.seed, verbose=verbose)
