"""When a run that cannot make progress stops (``launch.no_progress``)."""

from __future__ import annotations

from pydantic import Field

from zbrl.config.base import Section


class NoProgress(Section):
    """Bounds past which the driver stops a run that trains nothing (docs/survival.md, "No
    progress, no run"): it ends with one ``error:`` line naming the cause seen most, writes a
    resumable checkpoint and exits non-zero. The defaults are far beyond what a healthy run
    meets: a reward service down for seconds, or a few failing groups, never stop one."""

    max_failed_groups: int | None = Field(default=256, ge=1)
    """Stop when this many groups in a row failed (a failed episode or reward: dropped, never
    trained; no group in between had a score) and the streak lasted ``min_failing_s``. None:
    never stop for failed groups."""
    min_failing_s: float = Field(default=60.0, ge=0)
    """How long a streak of failed groups must have lasted (from its first group) before
    ``max_failed_groups`` stops the run: an outage shorter than this never does."""
    max_s_without_step: float | None = Field(default=1800.0, gt=0)
    """Stop when no step was trained for this many seconds (counted from the start of training,
    after the initial evaluation, then from each step). None: never."""
