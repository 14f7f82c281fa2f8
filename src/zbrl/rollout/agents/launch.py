"""Running a user's agent for one episode: an async function ``run(client, example)`` on an event
loop of its own thread, or a program in a subprocess. Either way the outcome is an
:class:`AgentOutcome`: a reward, a final answer, or a failure (timeout, crash, malformed result),
never an exception. How long an episode may go without a request is the episode runner's
watchdog's to judge (:class:`~zbrl.rollout.agents.environment.AgentEnvironment`)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentOutcome:
    """How an episode's agent ended: ``reward`` (it returned a number), ``answer`` (it returned
    a string, for the run's reward to score) or ``failure`` (``agent_timeouts``,
    ``agent_crashes`` or ``agent_malformed``, with ``detail``). ``counts``: events the agent
    itself counted (the verifiers harness's tool calls and failures), reported as ``env/<name>``.
    """

    reward: float | None = None
    correct: bool | None = None
    """Whether the agent judged the episode solved (``{"reward": r, "correct": bool}``): what
    held-out accuracy counts; None: the agent did not say."""
    answer: str | None = None
    failure: str | None = None
    detail: str = ""
    counts: dict[str, int] = field(default_factory=dict)


class EpisodeServer(Protocol):
    """A process that runs many episodes (a long-lived agent program)."""

    async def episode(self, base_url: str, key: str, example: dict[str, Any]) -> AgentOutcome:
        """One episode's outcome."""
        ...


_RESULTS = 'a number (its reward), a string (its answer) or {"reward": r, "correct": bool}'


def outcome_of(value: Any) -> AgentOutcome:
    """What an agent returned, read as an outcome: a number (the reward), a string (the
    answer) or ``{"reward": r, "correct": bool}`` (``correct`` optional). bool is no number
    here; zbrl's own agents, such as the verifiers one, return an outcome."""
    if isinstance(value, AgentOutcome):
        return value
    if isinstance(value, dict):
        return _reward_and_correct(value)
    if _is_number(value):
        if not math.isfinite(value):
            return AgentOutcome(failure="agent_malformed", detail=f"reward {value}")
        return AgentOutcome(reward=float(value))
    if isinstance(value, str):
        return AgentOutcome(answer=value)
    return AgentOutcome(
        failure="agent_malformed",
        detail=f"returned {type(value).__name__}; an agent returns {_RESULTS}",
    )


def _reward_and_correct(value: dict[str, Any]) -> AgentOutcome:
    reward, correct = value.get("reward"), value.get("correct")
    unknown = set(value) - {"reward", "correct"}
    if (
        unknown
        or not _is_number(reward)
        or not math.isfinite(reward)
        or not (correct is None or isinstance(correct, bool))
    ):
        return AgentOutcome(
            failure="agent_malformed",
            detail=f"returned {value!r}; an agent returns {_RESULTS}",
        )
    return AgentOutcome(reward=float(reward), correct=correct)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class AgentLauncher:
    """Starts episodes of one agent, each with its own API key, on a private event loop."""

    def __init__(
        self,
        run: Callable[..., Any] | None,
        command: list[str] | None,
        *,
        program: EpisodeServer | None = None,
    ) -> None:
        """``program``: a long-lived program that serves every episode
        (:class:`~zbrl.rollout.agents.program.LongLivedProgram`), instead of ``command``
        started per episode."""
        self.run = run
        self.command = command
        self.program = program
        self._client: Any = None
        """One ``openai.AsyncOpenAI`` (one connection pool) per endpoint URL; each episode gets a
        copy with its own key."""
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="zbrl-agents", daemon=True).start()

    def launch(self, base_url: str, key: str, example: dict[str, Any]) -> Future[AgentOutcome]:
        """One episode of the agent against ``base_url`` with ``key``; cancelling the future
        cancels the agent (a program's process is killed)."""
        return asyncio.run_coroutine_threadsafe(self._episode(base_url, key, example), self._loop)

    async def _episode(self, base_url: str, key: str, example: dict[str, Any]) -> AgentOutcome:
        try:
            if self.run is not None:
                return await self._call(base_url, key, example)
            if self.program is not None:
                return await self.program.episode(base_url, key, example)
            return await self._subprocess(base_url, key, example)
        except Exception as e:
            logger.warning("agent episode failed: %s: %s", type(e).__name__, e)
            return AgentOutcome(failure="agent_crashes", detail=f"{type(e).__name__}: {e}")

    async def _call(self, base_url: str, key: str, example: dict[str, Any]) -> AgentOutcome:
        import openai

        assert self.run is not None
        if self._client is None or str(self._client.base_url).rstrip("/") != base_url:
            self._client = openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0)
        client = self._client.with_options(api_key=key)
        return outcome_of(await self.run(client, example))

    async def _subprocess(self, base_url: str, key: str, example: dict[str, Any]) -> AgentOutcome:
        assert self.command is not None
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key}
        proc = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            out, err = await proc.communicate(json.dumps(example).encode())
        except asyncio.CancelledError:  # the episode's watchdog ended it
            proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-300:]
            return AgentOutcome(failure="agent_crashes", detail=f"exit {proc.returncode}: {tail}")
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            return outcome_of(json.loads(lines[-1]))
        except (IndexError, json.JSONDecodeError):
            return AgentOutcome(
                failure="agent_malformed",
                detail=f"the last line of stdout must be JSON: {_RESULTS}",
            )
