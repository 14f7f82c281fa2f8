"""Command line: zbrl train|resume|demo|eval|serve|report|plan|validate|models."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

# recipes/ lives at the repository root (docs/architecture.md, Layout and import rules); zbrl is
# installed from a checkout.
DEMO_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


def _cmd_validate(args: argparse.Namespace) -> int:
    from zbrl.assembly.environments import check_environment
    from zbrl.assembly.rewards import check_reward
    from zbrl.config import load_config, resolved_yaml

    cfg = load_config(args.recipe, args.overrides)
    check_reward(cfg)
    check_environment(cfg)
    sys.stdout.write(resolved_yaml(cfg))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from zbrl.config import load_config
    from zbrl.launch.driver import run_training
    from zbrl.launch.startup import StartupClock

    clock = StartupClock()  # from this process's start: the interpreter and imports count
    clock.mark("imports")
    cfg = load_config(args.recipe, args.overrides)
    if args.ray_address:
        cfg.launch.ray_address = args.ray_address
    clock.mark("config")
    summary = run_training(cfg, sibling_if_used=args.command == "demo", clock=clock)
    _print_finished(summary)
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    from zbrl.launch.driver import run_training
    from zbrl.launch.resume import plan_resume
    from zbrl.launch.startup import StartupClock

    clock = StartupClock()
    clock.mark("imports")
    cfg, checkpoint = plan_resume(Path(args.run_dir), args.overrides)
    if args.ray_address:
        cfg.launch.ray_address = args.ray_address
    clock.mark("config")
    print(f"[zbrl] resuming from {checkpoint.path} (step {checkpoint.version})", flush=True)
    _print_finished(run_training(cfg, resume=checkpoint, clock=clock))
    return 0


def _add_run_options(
    p: argparse.ArgumentParser, overrides_help: str, func: Callable[[argparse.Namespace], int]
) -> None:
    """What every command that starts a run takes after its own positional argument: dotted
    overrides and ``--ray-address``."""
    p.add_argument("overrides", nargs="*", help=overrides_help)
    p.add_argument("--ray-address", default=None, help="connect to this Ray cluster")
    p.set_defaults(func=func)


def _print_finished(summary: dict) -> None:
    steps, wall_s = summary["steps"], summary["wall_s"]
    print(f"run finished: {steps} steps in {wall_s:.1f}s -> {summary['run_dir']}")


def _cmd_demo(args: argparse.Namespace) -> int:
    args.recipe = str(DEMO_RECIPE)
    return _cmd_train(args)


def _cmd_report(args: argparse.Namespace) -> int:
    from zbrl.errors import RunError
    from zbrl.telemetry.report import render_report

    try:
        text = render_report(args.run_dir)
    except ValueError as exc:  # a run file that does not parse (read_timeline/read_metrics)
        raise RunError(
            f"{exc}; the run's files are damaged (a line written by something else, or cut "
            "short): fix or remove that line"
        ) from None
    print(text)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from zbrl.evaluation.serve import run_serve_command

    return run_serve_command(args)


def _cmd_eval(args: argparse.Namespace) -> int:
    from zbrl.evaluation.cli import run_eval_command

    return run_eval_command(args)


def _plain_zbrl_warnings() -> None:
    """zbrl's own warnings read as one ``warning: ...`` line, without a source location."""
    import warnings

    default = warnings.formatwarning

    def format_warning(message, category, filename, lineno, line=None):
        if issubclass(category, _loaded("zbrl.training.checkpoint", "IncompleteCheckpointWarning")):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = format_warning


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zbrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="print the fully resolved config of a recipe")
    p.add_argument("recipe", help="YAML recipe")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.lr=1e-5")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("train", help="run RL training from a recipe")
    p.add_argument("recipe", help="YAML recipe")
    _add_run_options(p, "dotted overrides, e.g. algorithm.lr=1e-5", _cmd_train)

    p = sub.add_parser(
        "resume",
        help="continue a run from its newest complete checkpoint",
        description="Continues with the run's saved config.yaml; overrides may change what "
        "resume can honour (for example a higher training.max_steps).",
    )
    p.add_argument("run_dir", help="the run directory (holds config.yaml and checkpoints/)")
    _add_run_options(p, "dotted overrides, e.g. training.max_steps=600", _cmd_resume)

    p = sub.add_parser("demo", help="run the embedded CPU demo (recipes/demo.yaml)")
    _add_run_options(p, "dotted overrides", _cmd_demo)

    p = sub.add_parser("report", help="print the busy/idle table and write report.png")
    p.add_argument("run_dir", help="a finished run directory")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser(
        "eval",
        help="evaluate a model or a saved checkpoint on datasets",
        description="Defaults come from the config's eval section (zbrl validate shows them): "
        "the recipe's, else the defaults, with the dotted overrides applied.",
    )
    p.add_argument(
        "--model",
        default=None,
        help="what model.path takes: a model or checkpoint directory (RUN_DIR/checkpoints/step-N), "
        "a .gguf file, a pulled model's name, a Hub id ORG/NAME or 'embedded' "
        "(default: the config's model.path)",
    )
    p.add_argument(
        "--data",
        required=True,
        action="append",
        help="dataset file (NAME=PATH ok; repeatable), or held_out (the held-out split of the "
        "config's training data) or embedded (the embedded task's held-out split)",
    )
    p.add_argument(
        "--recipe", default=None, help="the config to use (model, reward, eval, rollout settings)"
    )
    p.add_argument("--n", type=int, default=None, help="samples per prompt (eval.num_samples)")
    p.add_argument("--reward", default=None, help="reward type (reward.type)")
    p.add_argument("--temperature", type=float, default=None, help="0 is greedy (eval.temperature)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="generation budget (eval.max_new_tokens, else rollout.generation.max_new_tokens)",
    )
    p.add_argument("--max-prompts", type=int, default=None, help="eval.max_prompts")
    p.add_argument("--batch-size", type=int, default=None, help="eval.batch_size")
    p.add_argument("--out", default=None, help="directory for per-sample JSONL")
    p.add_argument(
        "overrides", nargs="*", help="dotted overrides after the options, e.g. eval.num_samples=4"
    )
    p.set_defaults(func=_cmd_eval)

    _add_serve_parser(sub)
    from zbrl.planning.command import add_plan_parser

    add_plan_parser(sub)
    from zbrl.models.command import add_models_parser

    add_models_parser(sub)
    return parser


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from zbrl.config.environments import AgentEndpoint

    p = sub.add_parser(
        "serve",
        help="serve a checkpoint or model over an OpenAI-compatible endpoint",
        description=(
            "Serves /v1/chat/completions, /v1/completions, /v1/responses and /v1/models, "
            "streaming too (docs/agents.md)."
        ),
    )
    p.add_argument(
        "model",
        help="what model.path takes: a checkpoint or model directory, a .gguf file, a pulled "
        "model's name, a Hub id or embedded",
    )
    p.add_argument("--recipe", default=None, help="take model and rollout settings from a recipe")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one)")
    p.add_argument("--temperature", type=float, default=1.0, help="default temperature")
    p.add_argument("--max-tokens", type=int, default=None, help="default and largest max_tokens")
    p.add_argument("--batch-window", type=float, default=0.02, help="seconds to gather a batch")
    p.add_argument("--max-batch", type=int, default=64, help="requests per backend batch at most")
    p.add_argument(
        "--api-key",
        default=None,
        help="requests must carry this key (Authorization: Bearer KEY), else 401; "
        "default: $ZBRL_API_KEY, else any key",
    )
    p.add_argument(
        "--allow-anyone",
        action="store_true",
        help="serve on a host that is not loopback without an API key (refused otherwise)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=AgentEndpoint.model_fields["max_request_bytes"].default,
        help="a larger request body is refused (413) before it is read",
    )
    p.set_defaults(func=_cmd_serve)


USER_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
"""File-system errors that come from a path the user gave; printed as ``error:`` lines."""


class _NotRaised(Exception):
    """Stands for an exception class whose module was never imported (so nothing raised it)."""


def _loaded(module: str, name: str) -> type[BaseException]:
    """The class ``module.name`` when ``module`` has been imported, else :class:`_NotRaised`.

    The command line imports only what the command needs (``zbrl models list`` neither Ray nor
    torch); an exception class that lives in a module the command never imported cannot have
    been raised, so ``main`` matches it without importing that module."""
    loaded = sys.modules.get(module)
    return getattr(loaded, name) if loaded is not None else _NotRaised


USER_MODULE_COMMANDS = ("validate", "train", "demo", "resume", "eval")
"""Commands that import a user's modules (rewards, environments, tools, algorithms) by path."""


def working_dir_importable() -> None:
    """The working directory first on ``sys.path``, as ``python -m`` puts it: a reward or
    environment module next to the recipe imports by ``module:name`` (the console script's
    own directory is the venv's ``bin/``). Ray gives the workers the driver's working directory
    too."""
    import os

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def main(argv: list[str] | None = None) -> int:
    """Run one command. A user's mistake (a config, a path, a dataset line, a missing package)
    ends in one ``error: ...`` line and a non-zero exit (2 for the config, 1 otherwise), never a
    traceback; ``zbrl train``/``resume``/``demo`` check everything before they create or lock a
    run directory (:mod:`zbrl.launch.preflight`)."""
    from zbrl.errors import RunError
    from zbrl.launch.signals import Interrupted, RunInterrupted, exit_code

    args = build_parser().parse_args(argv)
    _plain_zbrl_warnings()
    if args.command in USER_MODULE_COMMANDS:
        working_dir_importable()
    try:
        return args.func(args)
    except _loaded("zbrl.config.loader", "ConfigError") as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    except (RunError, _loaded("zbrl.data.dataset", "DatasetError"), *USER_OS_ERRORS) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print(f"interrupted by {exc}: stopped at once, nothing saved", file=sys.stderr)
        return exit_code(exc.signum)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
