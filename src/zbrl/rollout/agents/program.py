"""A long-lived agent program (``environment.program_lifetime: run``): one process serves every
episode of a producer (or the evaluator), so no process is started per episode.

Per episode zbrl writes one line of JSON to the program's stdin:
``{"id": KEY, "base_url": URL, "api_key": KEY, "example": {...}}`` (the key is the episode's API
key, the base URL the endpoint's). The program answers with one line of JSON on stdout whenever
the episode is done, in any order: ``{"id": KEY, "result": R}`` (R: a number, a string or
``{"reward": r, "correct": bool}``, as a per-episode program's last line) or
``{"id": KEY, "error": "why"}`` (``agent_crashes``). Other stdout lines (logs) are ignored.
Episodes arrive while others run: the program runs them concurrently. It is started with the
first episode and ends when its stdin closes (the producer ended); if it exits, the episodes it
was running fail (``agent_crashes``, with its stderr's end) and the next episode starts it again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import deque
from typing import Any

from zbrl.rollout.agents.launch import AgentOutcome, outcome_of

logger = logging.getLogger(__name__)

LINE_LIMIT = 1 << 24
"""Longest stdout line read (a result line may carry a long answer)."""


class LongLivedProgram:
    """The process of a long-lived agent program and its episodes in flight (see the module
    docstring). Used from one event loop (the agent launcher's)."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[str, asyncio.Future[AgentOutcome]] = {}
        self._stderr: deque[str] = deque(maxlen=20)
        self._starting: asyncio.Lock | None = None
        self._readers: list[asyncio.Future[None]] = []
        self.starts = 0
        """Processes started so far."""

    async def episode(self, base_url: str, key: str, example: dict[str, Any]) -> AgentOutcome:
        proc = await self._running(base_url)
        outcome: asyncio.Future[AgentOutcome] = asyncio.get_running_loop().create_future()
        self._pending[key] = outcome
        line = {"id": key, "base_url": base_url, "api_key": key, "example": example}
        try:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(line) + "\n").encode())
            await proc.stdin.drain()
            return await outcome
        except (BrokenPipeError, ConnectionResetError):
            return self._exited(proc)
        finally:
            self._pending.pop(key, None)

    async def _running(self, base_url: str) -> asyncio.subprocess.Process:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:  # episodes launched together share one start
            if self._proc is not None and self._proc.returncode is None:
                return self._proc
            self._stderr.clear()
            self._proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "OPENAI_BASE_URL": base_url},
                limit=LINE_LIMIT,
            )
            self.starts += 1
            self._readers = [
                asyncio.ensure_future(self._read_results(self._proc)),
                asyncio.ensure_future(self._read_stderr(self._proc)),
            ]
            return self._proc

    async def _read_results(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            try:
                message = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a log line
            if not isinstance(message, dict):
                continue
            outcome = self._pending.get(str(message.get("id")))
            if outcome is None or outcome.done():
                continue  # an episode that ended without it (its watchdog), or a log line
            outcome.set_result(_result(message))
        await proc.wait()
        for outcome in list(self._pending.values()):
            if not outcome.done():
                outcome.set_result(self._exited(proc))

    async def _read_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            self._stderr.append(raw.decode(errors="replace").rstrip())

    def _exited(self, proc: asyncio.subprocess.Process) -> AgentOutcome:
        tail = "\n".join(self._stderr)[-300:]
        return AgentOutcome(
            failure="agent_crashes",
            detail=f"the agent program exited ({proc.returncode}) during the episode: {tail}",
        )


def _result(message: dict[str, Any]) -> AgentOutcome:
    if "error" in message:
        return AgentOutcome(failure="agent_crashes", detail=str(message["error"])[:300])
    if "result" not in message:
        return AgentOutcome(
            failure="agent_malformed",
            detail='a long-lived program answers {"id": KEY, "result": R} or '
            '{"id": KEY, "error": "why"}',
        )
    return outcome_of(message["result"])
