"""An agent environment from its configuration (``environment`` with ``type: agent``, or
``type: verifiers``: a verifiers environment as the agent)."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path
from typing import Any

from zbrl.config.environments import AgentEnvironment as AgentConfig
from zbrl.config.environments import EndpointEnvironment, VerifiersEnvironment
from zbrl.errors import RunError
from zbrl.registry import import_object
from zbrl.rollout.agents.environment import AgentEnvironment, AgentSettings
from zbrl.rollout.agents.launch import AgentLauncher
from zbrl.rollout.agents.program import LongLivedProgram
from zbrl.rollout.endpoint.conversation import Renderer
from zbrl.rollout.endpoint.server import Endpoint, EndpointSettings


def build_agent_environment(
    cfg: EndpointEnvironment, tokenizer: Any, eos_ids: set[int], context_len: int | None
) -> AgentEnvironment:
    """The agent of ``cfg`` behind an endpoint over ``tokenizer``'s chat template (started on the
    first episode); ``context_len``: the backend's (a request past it is refused)."""
    run = build_agent(cfg)
    command = cfg.command if isinstance(cfg, AgentConfig) else None
    program = None
    if isinstance(cfg, AgentConfig) and cfg.program_lifetime == "run":
        assert command is not None  # the config's check
        program = LongLivedProgram(command)
    ep = cfg.endpoint
    endpoint = Endpoint(
        Renderer(tokenizer, eos_ids),
        EndpointSettings(
            host=ep.host,
            port=ep.port,
            batch_window_s=ep.batch_window_s,
            max_batch=ep.max_concurrency,
            request_timeout_s=ep.request_timeout_s,
            context_len=context_len,
            max_request_bytes=ep.max_request_bytes,
        ),
        model_name="policy",
    )
    settings = AgentSettings(cfg.on_history_change, cfg.timeout_s, cfg.retries)
    launcher = AgentLauncher(run, command, program=program)
    return AgentEnvironment(endpoint, launcher, settings)


def build_agent(cfg: EndpointEnvironment) -> Any:
    """The agent function of ``cfg`` (None for an agent program): the user's ``run``, or the
    verifiers environment's :class:`~zbrl.rollout.agents.verifiers_agent.VerifiersAgent`. A
    RunError naming the field when it cannot be built."""
    if isinstance(cfg, VerifiersEnvironment):
        from zbrl.rollout.agents.verifiers_agent import VerifiersAgent

        return VerifiersAgent(
            cfg.taskset, cfg.args, cfg.env, cfg.harness, cfg.fields, cfg.limits.tool_timeout_s
        )
    assert isinstance(cfg, AgentConfig)
    if cfg.command is not None:
        check_command(cfg.command)
    run = None
    if cfg.run is not None:
        try:
            run = import_object(cfg.run, "environment.run")
        except (ImportError, ValueError) as e:
            reason = e.__cause__ or e
            raise RunError(
                f"environment.run: cannot import {cfg.run} ({reason}); check the module path"
            ) from None
        if not inspect.iscoroutinefunction(run):
            raise RunError(
                f"environment.run: {cfg.run} is not an async function; write it as "
                "`async def run(client, example)` (docs/agents.md)"
            )
    try:
        import openai  # noqa: F401  (the client handed to the agent function)
    except ImportError:
        if run is not None:
            raise RunError(
                "environment.type=agent with `run` needs the openai client: "
                "pip install 'zbrl[agents]'"
            ) from None
    return run


_INTERPRETERS = ("python", "node", "bash", "sh", "ruby", "perl")
"""Programs whose first argument that is not an option is a script file."""


def check_command(command: list[str]) -> None:
    """Pre-flight of ``environment.command``: its program is on ``PATH`` (or a file), and the
    script an interpreter is given (``[python, my_agent.py]``) exists; a RunError naming the
    field otherwise. Paths are relative to the working directory, as the agent's will be."""
    program = command[0]
    if shutil.which(program) is None:
        raise RunError(
            f"environment.command: the program {program!r} is neither on PATH nor an "
            "executable file; give its path (or install it)"
        )
    name = Path(program).name
    if not any(
        name == i or name.startswith(i + "3") or name.startswith(i + ".") for i in _INTERPRETERS
    ):
        return
    for arg in command[1:]:
        if arg in ("-c", "-m", "-e"):
            return  # code or a module, not a file
        if arg.startswith("-"):
            continue
        if not Path(arg).is_file():
            raise RunError(
                f"environment.command: {name} is given the script {arg!r}, which does not exist "
                f"(from {Path.cwd()}); give the script's path"
            )
        return
