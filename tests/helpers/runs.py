"""Settings and checks shared by the tests' tiny end-to-end runs."""

from __future__ import annotations

import json
from pathlib import Path

WARM_START_STEPS = 5
"""``model.warm_start.steps`` of every tiny run in the tests: with the demo recipe's other
warm-start settings and seed 0, one warm start, built once in the session's shared cache
directory (the ``run_cache`` fixture), serves them all."""


def check_rollout_versions(run_dir: Path) -> None:
    """AssertionError unless the run's rollout log (``rollouts.jsonl``) shows responses that span
    two policy versions, every response's versions start at its first token and only go up, and
    each record's ``policy_version`` is its oldest response version (an in-flight run's log)."""
    records = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    changes = [c for r in records for c in r["version_changes"]]
    assert changes and all(c[0][0] == 0 for c in changes if c)
    spanning = [c for c in changes if len(c) > 1]
    assert spanning, "no response in the rollout log spans two versions"
    for c in spanning:  # versions go up inside a response, from the group's oldest
        versions = [v for _, v in c]
        assert versions == sorted(versions) and len(set(versions)) == len(versions)
    for r in records:
        assert r["policy_version"] == min(c[0][1] for c in r["version_changes"] if c)
