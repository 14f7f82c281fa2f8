"""OpenEnv environments (``environment.type: openenv``) as zbrl environments.

An OpenEnv environment is an HTTP/WebSocket server around an ``Environment`` class
(``reset``/``step``/``state``); a client holds one session on it. :class:`OpenEnvEnvironment`
starts the server (:class:`~zbrl.environments.openenv_process.OpenEnvServer`) on its first
episode, and each episode is one session of OpenEnv's own client (``GenericEnvClient``, whose
observations are dicts): ``start`` connects and resets with the sample's ``reset_fields``,
``step`` sends the model's turn as the action's ``action_field`` and answers with the
observation rendered as text (``render``, or the observation's ``message_field``), the step's
reward, and the end of the episode when the observation is ``done``. ``close`` ends the
session. The episode runner does the tokens, as for every environment.

A reset or step that does not come back (the server died, answered an error, ran past
``step_timeout_s``) or an observation that cannot be rendered raises
:class:`~zbrl.environments.base.EpisodeFailure`: the episode fails and its group is dropped
(``env/openenv_errors``, ``env/openenv_timeouts``, ``env/openenv_malformed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from zbrl.environments.base import EnvTurn, EpisodeFailure
from zbrl.environments.openenv_process import OpenEnvServer

Render = Callable[[dict[str, Any]], str]
"""``render(observation) -> str``: the message to the model from an observation's fields."""


@dataclass(frozen=True)
class OpenEnvSettings:
    """What :class:`OpenEnvEnvironment` needs of ``environment`` (an ``openenv`` section)."""

    server: str
    reset_fields: dict[str, str] = field(default_factory=dict)
    action_field: str = "message"
    message_field: str = "message"
    render: Render | None = None
    max_sessions: int = 256
    start_timeout_s: float = 120.0
    step_timeout_s: float = 60.0


def sample_value(example: dict[str, Any], name: str) -> Any:
    """The field ``name`` of a sample: a top-level key (``gt_answer``) or ``fields.NAME``."""
    head, _, rest = name.partition(".")
    if rest and head == "fields":
        return example["fields"][rest]
    return example[name]


class OpenEnvEnvironment:
    """Episodes as sessions of an OpenEnv environment server this object starts and stops."""

    parallel_steps = True
    """The episodes of a batch step at the same time: each is its own session."""

    def __init__(self, settings: OpenEnvSettings) -> None:
        self.settings = settings
        self.server = OpenEnvServer(
            settings.server, settings.max_sessions, settings.start_timeout_s
        )
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, example: dict[str, Any]) -> OpenEnvEpisode:
        """A new session, reset with the sample's ``reset_fields``."""
        from openenv.core import GenericEnvClient

        self._ensure_started()
        try:
            kwargs = {k: sample_value(example, v) for k, v in self.settings.reset_fields.items()}
        except (KeyError, TypeError) as e:
            raise EpisodeFailure(
                "openenv_errors", f"the sample has no field {e} (environment.reset_fields)"
            ) from None
        timeout = self.settings.step_timeout_s
        client = GenericEnvClient(
            base_url=self.server.url, connect_timeout_s=timeout, message_timeout_s=timeout
        )
        episode = OpenEnvEpisode(self, client)
        try:
            episode.observation = self.call(client.reset(**kwargs)).observation
        except EpisodeFailure:
            episode.close()
            raise
        return episode

    def call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run a client coroutine on this environment's event loop; its result, or an
        EpisodeFailure."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout=2 * self.settings.step_timeout_s + 5)
        except TimeoutError:
            future.cancel()
            raise EpisodeFailure(
                "openenv_timeouts", f"no answer within {self.settings.step_timeout_s:g} s"
            ) from None
        except Exception as e:
            raise EpisodeFailure("openenv_errors", f"{type(e).__name__}: {e}") from None

    def message(self, observation: dict[str, Any]) -> str:
        """The model's next message from ``observation``."""
        render = self.settings.render
        try:
            text = (
                render(observation)
                if render is not None
                else observation[self.settings.message_field]
            )
        except Exception as e:
            raise EpisodeFailure(
                "openenv_malformed", f"cannot render the observation: {type(e).__name__}: {e}"
            ) from None
        if not isinstance(text, str):
            raise EpisodeFailure(
                "openenv_malformed", f"the observation's message is {type(text).__name__}, not str"
            )
        return text

    @property
    def running(self) -> bool:
        """True while the client's event loop runs (between the first episode and close)."""
        return self._loop is not None

    def close(self) -> None:
        """Stop the server and the event loop."""
        self.server.stop()
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def _ensure_started(self) -> None:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=loop.run_forever, name="zbrl-openenv-client", daemon=True
                )
                self._thread.start()
                self._loop = loop
            if self.server.proc is None:
                self.server.start()


class OpenEnvEpisode:
    """One session: the model's turns as actions, the observations as its messages."""

    def __init__(self, env: OpenEnvEnvironment, client: Any) -> None:
        self.env = env
        self.client = client
        self.observation: dict[str, Any] = {}
        """The last observation (the reset's, then each step's)."""

    def step(self, model_text: str) -> EnvTurn:
        result = self.env.call(self.client.step({self.env.settings.action_field: model_text}))
        self.observation = result.observation
        reward = float(result.reward or 0.0)
        info = {"reward": reward, "done": bool(result.done)}
        if result.done:
            return EnvTurn(message=None, reward=reward, info=info)
        return EnvTurn(message=self.env.message(result.observation), reward=reward, info=info)

    def close(self) -> None:
        """End the session (the server frees its slot)."""
        if self.env.running:
            with contextlib.suppress(EpisodeFailure):  # a dead server has no session to free
                self.env.call(self.client.close())
