"""``environment.type: verifiers``: an environment of the ``verifiers`` package as the agent of
an agent environment (docs/agents.md).

For each sample, :class:`VerifiersAgent` makes a task of the verifiers taskset's own task type
(the sample's ``messages`` as its prompt, plus the data fields ``environment.fields`` maps from
the sample) and runs it with verifiers' own episode code (``Env.run_episode``): verifiers plays
the task with its harness, every model call going through its interception server to zbrl's
endpoint with the episode's key, then scores the trace with the task's rewards. The episode's
reward is the trace's; the trained tokens are what the endpoint recorded, as for any agent. An
episode verifiers reports as failed (``episode.ok`` false) is an agent crash: counted, and its
group dropped.

The episode's key reaches the endpoint in the ``X-Zbrl-Episode`` header, which the harness
sends with every model request and verifiers forwards (zbrl's ``ChatHarness`` reads the key from
a context variable set around the episode: ``verifiers_harness.EPISODE_KEY``). Not as verifiers'
API key: verifiers reads that from an environment variable and keeps one client per distinct
client configuration until the run ends, so a variable per episode would leave a client per
episode behind (about 0.85 MB and a connection each, measured on verifiers 0.4.0). All episodes
share one configuration (:data:`NO_KEY_VAR`), hence one client, and no key is ever put in the
process's environment.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from zbrl.errors import RunError
from zbrl.rollout.agents.launch import AgentOutcome

NO_KEY_VAR = "ZBRL_VERIFIERS_NO_KEY"
"""The variable verifiers' client reads its API key from: never set (the client then sends
``EMPTY``); the episode is named by its header (see the module docstring)."""

MODEL_NAME = "policy"
"""The model name the endpoint serves (``/v1/models``)."""


def plugin_id(name: str, field: str) -> str:
    """The id verifiers loads ``environment.<field>`` (a taskset, harness or env module) by.

    verifiers 0.4 imports a plugin by a top-level module name: its loader first looks the name up
    in its own package (``importlib.util.find_spec("verifiers.v1.tasksets." + name)``), which
    raises for a dotted name, whose parent is no package of verifiers. So zbrl imports a dotted
    module itself and hands verifiers a top-level alias of it in ``sys.modules``
    (``zbrl_vf_<the name with _ for .>``; the module keeps its own name). A ``.py`` file names a
    module by its file (its directory put on ``sys.path``). The working directory is on
    ``sys.path`` for every form; hub ids (``owner/name@version``) are verifiers' own."""
    if not name:
        return name
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)
    if name.endswith(".py"):
        path = Path(name).resolve()
        if not path.is_file():
            raise RunError(f"environment.{field}: no file {name} (from {cwd})")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        return path.stem
    if "." not in name or "/" in name or "@" in name:
        return name
    try:
        module = importlib.import_module(name)
    except Exception as e:
        raise RunError(
            f"environment.{field}: cannot import {name!r} ({type(e).__name__}: {e}); give an "
            f"installed module, one importable from the working directory ({cwd}), or the "
            "module's .py file"
        ) from None
    alias = "zbrl_vf_" + name.replace(".", "_").lower()
    sys.modules[alias] = module
    return alias


def importable_by_tool_servers(module: str) -> None:
    """Put the directory ``module`` was imported from on ``PYTHONPATH`` (unless it is an
    installed package's): verifiers runs a taskset's tool servers as processes of their own
    (``python -m <module of the Toolset>``), which must import the module as this process did
    (a taskset shipped next to the recipe, or one in the working directory)."""
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None or spec.origin is None:
        return
    origin = Path(spec.origin)
    root = origin.parent.parent if origin.name == "__init__.py" else origin.parent
    if root.name in ("site-packages", "dist-packages"):
        return
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(root) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *paths])


class VerifiersAgent:
    """``async run(client, example)`` playing one task of a verifiers environment: ``taskset``,
    ``env`` and ``harness`` as :func:`plugin_id` reads them (``harness`` empty: the taskset's
    own), ``args`` its taskset config, ``fields`` the task data fields from the sample's, and
    ``tool_timeout_s`` the harness's deadline per tool call (its ``tool_timeout``)."""

    def __init__(
        self,
        taskset: str,
        args: dict[str, Any],
        env: str,
        harness: str,
        fields: dict[str, str],
        tool_timeout_s: float,
    ) -> None:
        try:
            import verifiers.v1 as vf
        except ImportError:
            raise RunError(
                "environment.type=verifiers needs the verifiers package: "
                "pip install 'zbrl[verifiers]'"
            ) from None
        from zbrl.rollout.agents.verifiers_harness import COUNTS, EPISODE_KEY

        self._vf = vf
        self._episode_key = EPISODE_KEY
        self._counts = COUNTS
        taskset_id = plugin_id(taskset, "taskset")
        harness_id = plugin_id(harness, "harness")
        env_id = plugin_id(env, "env")
        try:
            harness_config = {
                "id": harness_id or vf.default_harness_id(taskset_id),
                "tool_timeout": tool_timeout_s,
            }
            config = {
                "id": env_id,
                "taskset": {"id": taskset_id, **args},
                "agent": {"runtime": {"type": "subprocess"}, "harness": harness_config},
            }
            self.env = vf.load_environment(vf.resolve_env_config(config))
        except Exception as e:  # verifiers' own message says what is wrong
            raise RunError(
                f"environment: cannot load the verifiers environment of taskset {taskset!r} "
                f"({type(e).__name__}: {e})"
            ) from None
        task_type = type(self.env.taskset).task_type()
        self.task_type = task_type
        self.task_config = self.env.taskset.config.task
        self.data_type = task_type.data_type()
        unknown = sorted(set(fields) - set(self.data_type.model_fields))
        if unknown:
            raise RunError(
                f"environment.fields: {', '.join(unknown)} not a field of "
                f"{self.data_type.__name__} (its fields: "
                f"{', '.join(sorted(self.data_type.model_fields))})"
            )
        self.fields = dict(fields)
        toolsets = [
            *type(self.env.taskset).toolsets(self.env.taskset.config),
            *task_type.toolsets(self.task_config),
        ]
        for toolset in toolsets:
            importable_by_tool_servers(type(toolset).__module__)
        self._serving: AsyncExitStack | None = None
        self._lock: asyncio.Lock | None = None

    def task(self, example: dict[str, Any]) -> Any:
        """The verifiers task of a dataset sample."""
        missing = [src for src in self.fields.values() if src not in example]
        if missing:
            raise KeyError(f"the sample has no {', '.join(missing)} (environment.fields)")
        data = {field: example[src] for field, src in self.fields.items()}
        return self.task_type(self.data_type(prompt=example["messages"], **data), self.task_config)

    async def __call__(self, client: Any, example: dict[str, Any]) -> AgentOutcome:
        """One episode: the task of ``example`` played through ``client``'s endpoint with its key;
        the reward of the episode's traces, and the harness's tool counts (``env/tool_*``)."""
        vf = self._vf
        await self._serve()
        ctx = vf.ModelContext(
            model=MODEL_NAME,
            client=vf.EvalClientConfig(base_url=str(client.base_url), api_key_var=NO_KEY_VAR),
        )
        token = self._episode_key.set(client.api_key)
        try:
            episode = await self.env.run_episode(self.task(example), ctx)
        finally:
            self._episode_key.reset(token)
        if not episode.ok:
            errors = [e for t in episode.traces for e in t.errors] + list(episode.errors)
            detail = "; ".join(f"{e.type}: {e.message}" for e in errors) or "not ok"
            raise RuntimeError(f"verifiers episode failed: {detail[:500]}")
        metrics = [t.metrics for t in episode.traces]
        counts = {name: int(sum(m.get(name) or 0 for m in metrics)) for name in self._counts}
        reward = float(sum(t.reward for t in episode.traces))
        return AgentOutcome(reward=reward, counts={k: n for k, n in counts.items() if n})

    async def _serve(self) -> None:
        """verifiers' serving resources (its interception server), brought up once on the
        agents' event loop and held for the run."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._serving is None:
                stack = AsyncExitStack()
                await stack.enter_async_context(self.env.serving())
                self._serving = stack

    async def aclose(self) -> None:
        """Tear verifiers' serving resources down (a run's end does it by ending the process)."""
        if self._serving is not None:
            await self._serving.aclose()
            self._serving = None
