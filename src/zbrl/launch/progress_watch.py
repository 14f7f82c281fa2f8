"""No progress, no run: the driver's decision to stop a run that trains nothing.

Two bounds (``launch.no_progress``, :class:`zbrl.config.progress.NoProgress`):

- **failed groups in a row**: every group that arrives without a score (a failed episode or
  reward) is dropped and its ticket makes another, so a cause that fails every group (an agent
  that raises, an endpoint that refuses its requests, a reward service that stays down, an
  environment server that died) would have the producers spin forever. ``max_failed_groups``
  such groups in a row, over at least ``min_failing_s`` seconds, stop the run;
- **time without a step**: ``max_s_without_step`` seconds without a trained step (a run stuck
  anywhere else).

The verdict is one line: what was seen, the cause seen most (failed groups per cause, from the
buffer's :class:`~zbrl.transport.failure_log.FailureLog`) with its first message, and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zbrl.config.progress import NoProgress

MESSAGE_CHARS = 400
"""A cause's first message is cut to this many characters (on one line)."""

FIXES = (  # (cause prefix, fix): the first that matches
    (
        "agent_timeouts",
        "the agent made no request and got no answer for environment.timeout_s: raise it, or "
        "find where the agent hangs",
    ),
    (
        "agent_",
        "fix the agent (environment.run or environment.command): run it on one example by hand; "
        "a request the endpoint refused says why in its message (docs/agents.md, Endpoint errors "
        "and limits)",
    ),
    (
        "reward_failed",
        "fix the reward: a service or judge that does not answer, a worker or sandbox that "
        "fails; check that it answers, or raise reward.timeout_s (docs/rewards.md)",
    ),
    (
        "teacher_failed",
        "fix the distillation teacher (algorithm.distill.teacher): its forward pass raised; "
        "check that it loads and scores one sequence, and its memory (docs/algorithms.md)",
    ),
    (
        "",
        "fix the environment (environment.*): its episodes failed before they could be scored "
        "(docs/environments.md)",
    ),
)


def fix_for(cause: str) -> str:
    """What to do about failures of ``cause``."""
    return next(fix for prefix, fix in FIXES if cause.startswith(prefix))


@dataclass
class ProgressWatch:
    """Decides, from the trained step and the buffer's failure log, whether a run has stopped
    making progress (see the module docstring). Times are wall-clock seconds."""

    settings: NoProgress
    step: int
    """The newest trained step seen."""
    step_at: float
    """When it was first seen (or when the watch started)."""

    def verdict(self, step: int, now: float, failures: dict[str, Any]) -> str | None:
        """None while the run may go on; else the one-line reason to stop it. ``failures``:
        :meth:`FailureLog.as_dict`."""
        if step != self.step:
            self.step, self.step_at = step, now
        s = self.settings
        streak, since = failures["streak"], failures["streak_since"]
        if (
            s.max_failed_groups is not None
            and streak >= s.max_failed_groups
            and since is not None
            and now - since >= s.min_failing_s
        ):
            seen = (
                f"the last {streak} groups all failed, over {now - since:.0f} s "
                f"(launch.no_progress.max_failed_groups={s.max_failed_groups}, "
                f"min_failing_s={s.min_failing_s:g})"
            )
            return _line(seen, failures["streak_groups"], failures["first"], streak)
        idle = now - self.step_at
        if s.max_s_without_step is not None and idle >= s.max_s_without_step:
            seen = (
                f"no step was trained in {idle:.0f} s "
                f"(launch.no_progress.max_s_without_step={s.max_s_without_step:g})"
            )
            if not failures["groups"]:
                return (
                    f"no progress: {seen}, and no group failed; a worker is stuck: `zbrl report "
                    "RUN_DIR` shows which role was waiting on which"
                )
            return _line(
                seen, failures["groups"], failures["first"], sum(failures["groups"].values())
            )
        return None


def _line(seen: str, groups: dict[str, int], first: dict[str, str], total: int) -> str:
    cause = max(groups, key=lambda c: groups[c])
    message = " ".join(first[cause].split())
    if len(message) > MESSAGE_CHARS:
        message = message[: MESSAGE_CHARS - 3] + "..."
    others = ", ".join(f"{c} ({n})" for c, n in sorted(groups.items()) if c != cause)
    also = f"; also {others}" if others else ""
    return (
        f"no progress: {seen}; the cause seen most is {cause} ({groups[cause]} of {total} "
        f"failed groups{also}), first: {message}; {fix_for(cause)}"
    )
