"""Environments and tools from their configuration (``environment`` of a RunConfig)."""

from __future__ import annotations

from typing import Any

from zbrl.config.environments import (
    CalculatorTool,
    OpenEnvEnvironment,
    PythonTool,
    ToolsEnvironment,
)
from zbrl.environments.base import Environment
from zbrl.environments.tool_env import ToolEnvironment, ToolSettings
from zbrl.environments.tools import Calculator, SandboxedPython, Tool
from zbrl.errors import RunError as ConfigError
from zbrl.registry import import_object


def build_environment(cfg: Any) -> Environment:
    """The environment of ``cfg`` (a ``ToolsEnvironment``, ``OpenEnvEnvironment`` or
    ``UserEnvironment`` section)."""
    if isinstance(cfg, OpenEnvEnvironment):
        return build_openenv_environment(cfg)
    if isinstance(cfg, ToolsEnvironment):
        timeout = cfg.limits.tool_timeout_s
        tools = [build_tool(t, timeout) for t in cfg.tools]
        settings = ToolSettings(
            call_format=cfg.call_format,
            on_error=cfg.on_error,
            max_result_chars=cfg.max_result_chars,
            tool_timeout_s=timeout,
            stop_after_call=cfg.stop_after_call,
        )
        try:
            return ToolEnvironment(tools, settings)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    cls = import_user_class(cfg.type, "environment.type")
    env = _constructed(cls, cfg.type, cfg.options, "environment.options", "environment.options")
    if not callable(getattr(env, "start", None)):
        raise ConfigError(
            f"environment.type: {cfg.type} has no start(example) method (docs/environments.md)"
        )
    return env


def build_openenv_environment(cfg: OpenEnvEnvironment) -> Environment:
    """An OpenEnv environment (its server starts with its first episode): the server class
    and ``render`` are imported here, so a bad path is a ConfigError naming its field before
    anything starts."""
    from zbrl.environments.openenv_env import OpenEnvEnvironment as OpenEnvProxy
    from zbrl.environments.openenv_env import OpenEnvSettings
    from zbrl.environments.openenv_serve import action_and_observation_classes

    try:
        import openenv.core  # noqa: F401  (the client, and what the server class subclasses)
    except ImportError:
        raise ConfigError(
            "environment.type=openenv needs OpenEnv: pip install 'zbrl[openenv]'"
        ) from None
    env_cls = import_user_class(cfg.server, "environment.server")
    try:
        action_cls, _ = action_and_observation_classes(env_cls)
    except ValueError as e:
        raise ConfigError(f"environment.server: {cfg.server}: {e} (docs/environments.md)") from None
    fields = list(getattr(action_cls, "model_fields", {}))
    if cfg.action_field not in fields:
        raise ConfigError(
            f"environment.action_field: {cfg.action_field!r} is not a field of "
            f"{action_cls.__name__}, the action of {cfg.server} (its fields: "
            f"{', '.join(fields) or 'none'}); set it to the field that takes the model's text"
        )
    render = import_user_class(cfg.render, "environment.render") if cfg.render else None
    if render is not None and not callable(render):
        raise ConfigError(f"environment.render: {cfg.render} is not a function")
    return OpenEnvProxy(
        OpenEnvSettings(
            server=cfg.server,
            reset_fields=dict(cfg.reset_fields),
            action_field=cfg.action_field,
            message_field=cfg.message_field,
            render=render,
            max_sessions=cfg.max_sessions,
            start_timeout_s=cfg.start_timeout_s,
            step_timeout_s=cfg.step_timeout_s,
        )
    )


def build_tool(cfg: Any, timeout_s: float) -> Tool:
    if isinstance(cfg, CalculatorTool):
        return Calculator(cfg.name, cfg.tag, cfg.description)
    if isinstance(cfg, PythonTool):
        if cfg.backend == "bwrap":
            check_bwrap_works(cfg.name)
        return SandboxedPython(
            cfg.name,
            cfg.tag,
            description=cfg.description,
            timeout_s=timeout_s,
            memory_mb=cfg.memory_mb,
            backend=cfg.backend,
        )
    cls = import_user_class(cfg.type, "environment.tools[].type")
    tool = _constructed(
        cls, cfg.type, cfg.options, "environment.tools: options", "environment.tools"
    )
    if cfg.description is not None:
        tool.description = cfg.description
    missing = [a for a in TOOL_ATTRIBUTES if not hasattr(tool, a)]
    if missing:
        raise ConfigError(
            f"environment.tools: {cfg.type} lacks {', '.join(missing)} (a tool has "
            f"{', '.join(TOOL_ATTRIBUTES[:-1])} and call(arguments) -> str; "
            "docs/environments.md)"
        )
    if not isinstance(tool.parameters, dict) or tool.parameters.get("type") != "object":
        raise ConfigError(
            f"environment.tools: {cfg.type}.parameters must be the JSON schema of the arguments "
            'object ({"type": "object", "properties": {...}, "required": [...]}), not '
            f"{tool.parameters!r}"
        )
    return tool


TOOL_ATTRIBUTES = ("name", "description", "parameters", "tag", "argument", "call")
"""What every tool has (:class:`zbrl.environments.tools.Tool`)."""


def check_bwrap_works(tool_name: str) -> None:
    """A python tool that asks for the ``bwrap`` backend where it does not work is refused when
    it is built (at pre-flight), not answered with a counted error at every call."""
    from zbrl.sandbox.bubblewrap import INSTALL_HINT, probe_bwrap

    probe = probe_bwrap()
    if not probe.works:
        raise ConfigError(
            f"environment.tools: the python tool {tool_name!r} has backend=bwrap, which does "
            f"not work here ({probe.error}); set its backend to auto or rlimits, or "
            f"{INSTALL_HINT} (docs/sandbox.md)"
        )


def import_user_class(path: str, field: str) -> Any:
    """A user's environment or tool class by ``package.module:Class`` path (imported by the one
    registry's :func:`zbrl.registry.import_object`); a path that does not import is a
    ConfigError naming ``field``."""
    try:
        return import_object(path, field)
    except (ImportError, ValueError) as e:
        reason = e.__cause__ or e  # the import's own error, when there is one
        raise ConfigError(
            f"{field}: cannot import {path} ({reason}); check the module path"
        ) from None


def _constructed(
    cls: Any, path: str, options: dict[str, Any], options_field: str, where: str
) -> Any:
    """``cls(**options)`` for the user's class at ``path``; options it does not take are a
    ConfigError naming ``options_field``, any other failure of the class one naming ``where``."""
    try:
        return cls(**options)
    except TypeError as e:
        raise ConfigError(f"{options_field} do not fit {path}: {e}") from None
    except Exception as e:  # the user's class refused its options
        raise ConfigError(
            f"{where}: {path}(**options) failed ({type(e).__name__}: {e}); fix the options or "
            "the class"
        ) from None
