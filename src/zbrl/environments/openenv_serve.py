"""The OpenEnv environment server that zbrl starts: ``python -m zbrl.environments.openenv_serve
SERVER MAX_SESSIONS PARENT_PID``.

It imports the OpenEnv ``Environment`` class ``SERVER`` (``package.module:Class``), builds its app
with OpenEnv's own ``create_fastapi_app`` (one environment per WebSocket session, at most
``MAX_SESSIONS`` at once), binds a free port on 127.0.0.1, writes ``PORT <n>`` as the first line
of its stdout and serves until it is stopped, or until its parent (the producer or evaluator
that started it, ``PARENT_PID``) is gone, whichever comes first: a parent killed without a
chance to stop it (SIGKILL) leaves no server behind. A class that cannot be served is one line
on stderr and exit status 2.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import typing
from typing import Any

from zbrl.registry import import_object

PORT_LINE = "PORT"
"""The first word of the line that reports the port."""

BAD_SERVER = 2
"""Exit status of a ``SERVER`` that cannot be served (the reason is on stderr)."""


def action_and_observation_classes(env_cls: type) -> tuple[type, type]:
    """The action and observation classes of an OpenEnv ``Environment`` subclass written as
    ``Environment[MyAction, MyObservation, MyState]`` (from its generic base); ValueError when
    it does not say."""
    from openenv.core.env_server import Action, Environment, Observation

    if not (isinstance(env_cls, type) and issubclass(env_cls, Environment)):
        raise ValueError(f"{env_cls!r} is not an OpenEnv Environment subclass")
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Environment):
                args = typing.get_args(base)
                if (
                    len(args) >= 2
                    and isinstance(args[0], type)
                    and issubclass(args[0], Action)
                    and isinstance(args[1], type)
                    and issubclass(args[1], Observation)
                ):
                    return args[0], args[1]
    raise ValueError(
        f"{env_cls.__name__} does not name its action and observation classes; subclass "
        "Environment[MyAction, MyObservation, MyState]"
    )


def build_app(server: str, max_sessions: int) -> Any:
    """The FastAPI app serving the environment class ``server`` (OpenEnv's own app)."""
    from openenv.core.env_server import create_fastapi_app

    env_cls = import_object(server, "environment.server")
    action_cls, observation_cls = action_and_observation_classes(env_cls)
    if max_sessions > 1 and not getattr(env_cls, "SUPPORTS_CONCURRENT_SESSIONS", False):
        raise ValueError(
            f"{env_cls.__name__} does not set SUPPORTS_CONCURRENT_SESSIONS = True, and a "
            "producer runs its episodes at the same time (one session each); declare it when "
            "its instances share no state"
        )
    return create_fastapi_app(
        env_cls, action_cls, observation_cls, max_concurrent_envs=max_sessions
    )


def exit_with_parent(parent_pid: int, poll_s: float = 0.5) -> None:
    """End this process as soon as ``parent_pid`` is no longer its parent (a daemon thread)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, name="zbrl-openenv-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    server, max_sessions, parent_pid = argv[0], int(argv[1]), int(argv[2])
    exit_with_parent(parent_pid)
    try:
        app = build_app(server, max_sessions)
    except Exception as e:  # the parent reports it, naming environment.server
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return BAD_SERVER
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(f"{PORT_LINE} {sock.getsockname()[1]}", flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads stdout from here on
    config = uvicorn.Config(app, log_level="warning", ws_ping_interval=None)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
