"""Why groups fail, as the buffer sees them arrive: failed groups counted per cause with the
first message of each, and the current streak of groups that all failed.

A group fails when it has no trustworthy score (``RolloutGroup.reward_failed`` or
``episode_failures``: the buffer drops it and its ticket makes another). Its cause is the kind
of its first failure (``RolloutGroup.failure``, ``kind: detail``): ``agent_crashes``,
``agent_timeouts``, ``reward_failed``, an environment's failure kind, .... The streak counts
the failed groups since the last group that arrived with a score (filtered or not: it was
scored); ``streak_since`` is when its first failed group arrived. The driver's no-progress
watch (:mod:`zbrl.launch.progress_watch`) reads them to stop a run that cannot train.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


def cause_of(failure: str) -> str:
    """The cause of a failure message (its kind, before the first ``:``)."""
    return failure.split(":", 1)[0].strip() or "unknown"


@dataclass
class FailureLog:
    """See the module docstring."""

    groups: dict[str, int] = field(default_factory=dict)
    """Failed groups per cause."""
    first: dict[str, str] = field(default_factory=dict)
    """The first failure message of each cause."""
    streak: int = 0
    """Failed groups in a row (since the last scored group)."""
    streak_since: float | None = None
    """Wall time of the streak's first failed group (None: no streak)."""
    streak_groups: dict[str, int] = field(default_factory=dict)
    """The streak's failed groups per cause."""

    def failed(self, failure: str, now: float | None = None) -> None:
        """A group arrived that failed with ``failure`` (``kind: detail``)."""
        cause = cause_of(failure)
        self.groups[cause] = self.groups.get(cause, 0) + 1
        self.first.setdefault(cause, failure)
        if self.streak == 0:
            self.streak_since = time.time() if now is None else now
            self.streak_groups = {}
        self.streak += 1
        self.streak_groups[cause] = self.streak_groups.get(cause, 0) + 1

    def scored(self) -> None:
        """A group arrived with a score: the streak ends."""
        self.streak, self.streak_since, self.streak_groups = 0, None, {}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
