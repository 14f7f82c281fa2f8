"""The first program of each Ray worker process of a local run: zbrl's stand-in for Ray's
``setup_worker.py``, which imports nothing but the standard library.

A raylet starts each Python worker as ``python setup_worker.py [--serialized-runtime-env-context=
JSON] [--language=PYTHON] default_worker.py ARGS``. Ray's ``setup_worker.py`` only applies the
runtime environment's context (environment variables, a command prefix, another Python) and then
replaces itself with ``bash -c "exec python default_worker.py ARGS"``, but to do so it imports
Ray (0.55 CPU-s on its own; about 0.16 CPU-s less per worker in a run, measured), which
``default_worker.py`` imports again a moment later (docs/performance.md, Start-up). Above all,
it is where a worker can be handed to the fork server instead of started afresh.

This program does the same with ``json`` and ``os``. It hands over to Ray's own
``setup_worker.py`` (found beside the installed ``ray`` package, which is located, not imported)
for anything it does not know: a language other than Python, a context it cannot read, or one
with fields other than the five Ray's ``RuntimeEnvContext`` had when this was written.
:func:`zbrl.launch.local_ray.replacements.light_worker_setup` puts it in the raylet's command;
a raylet started elsewhere (``ray start`` on a cluster's node) keeps Ray's. When the run's fork
server is up (:mod:`zbrl.launch.local_ray.forkserver`), the worker is forked from it instead of
started afresh, and this process stays as its stand-in.

Run as a script, its folder would come first on ``sys.path`` (this package's modules shadowing
the standard library's), so the folder is dropped before anything is imported.
"""

import sys

if __name__ == "__main__":
    del sys.path[0]

import importlib.util
import json
import os
import re
import shlex

OWN_FLAGS = ("--serialized-runtime-env-context", "--language")
KNOWN_CONTEXT = {
    "command_prefix",
    "env_vars",
    "py_executable",
    "override_worker_entrypoint",
    "java_jars",
}
FORK_SERVER_ENV = "ZBRL_WORKER_FORKSERVER"  # forkserver.SOCKET_ENV
UNSET_VARIABLE = re.compile(r"\$\{[A-Z0-9_]+\}")


def split_arguments(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """``argv``'s own flags (``--name=value`` or ``--name value``, anywhere, as ``argparse``'s
    ``parse_known_args`` reads them in Ray's program) and the rest, in order."""
    flags: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in OWN_FLAGS:
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            flags[name] = value
        else:
            rest.append(arg)
        i += 1
    return flags, rest


def worker_command(context: dict, rest: list[str]) -> list[str] | None:
    """The command Ray's ``RuntimeEnvContext.exec_worker`` runs for a Python worker (with
    ``bash -c`` only when there is a command prefix), or None where this program does not know
    the context."""
    if set(context) - KNOWN_CONTEXT or context.get("java_jars"):
        return None
    rest = list(rest)
    if context.get("override_worker_entrypoint") and rest:
        rest[0] = context["override_worker_entrypoint"]
    python = context.get("py_executable") or sys.executable
    prefix = context.get("command_prefix") or []
    if not prefix:
        return [python, *rest]
    line = " ".join([*prefix, "exec", python, *(shlex.quote(a) for a in rest)])
    return ["bash", "-c", line]


def apply_environment(env_vars: dict[str, str]) -> None:
    """Ray's ``update_envs``: ``${X}`` expands to the current value, an unset one to nothing."""
    for key, value in env_vars.items():
        os.environ[key] = UNSET_VARIABLE.sub("", os.path.expandvars(value))


def ray_setup_worker() -> str:
    """The path of Ray's ``setup_worker.py`` in the installed ``ray`` package."""
    spec = importlib.util.find_spec("ray")  # a top-level package is found without running it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("zbrl worker_exec: the ray package is not installed for " + sys.executable)
    folder = next(iter(spec.submodule_search_locations))
    return os.path.join(folder, "_private", "workers", "setup_worker.py")


def main(argv: list[str]) -> None:
    flags, rest = split_arguments(argv)
    command = None
    if flags.get("--language", "PYTHON") == "PYTHON":
        try:
            context = json.loads(flags.get("--serialized-runtime-env-context") or "{}")
        except ValueError:
            context = None
        if isinstance(context, dict):
            command = worker_command(context, rest)
            if command is not None:
                apply_environment(context.get("env_vars") or {})
    if command is None:  # not ours to read: Ray's own program, with the arguments as given
        command = [sys.executable, ray_setup_worker(), *argv]
    elif command[0] == sys.executable and os.environ.get(FORK_SERVER_ENV):
        code = forked_by_server(os.environ[FORK_SERVER_ENV], command[1:])
        if code is not None:
            sys.exit(code)
    os.execvp(command[0], command)


def forked_by_server(socket_path: str, argv: list[str]) -> int | None:
    """The worker ``argv`` forked by the run's fork server, this process standing in for it
    (:mod:`zbrl.launch.local_ray.forkserver`, loaded from beside this file without importing the
    zbrl package): its exit code, or None when the server is not there or refuses it."""
    if not argv or argv[0].startswith("-"):  # interpreter flags: not a fork's to honour
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkserver.py")
    spec = importlib.util.spec_from_file_location("zbrl_local_ray_forkserver", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_through_server(socket_path, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
