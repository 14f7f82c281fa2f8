"""No progress, no run, end to end: the agent demo with an agent whose every request the
endpoint refuses (it asks for more tokens than the model's context) stops by itself, at the
defaults of ``launch.no_progress``, with a non-zero exit, one ``error:`` line naming the cause and
the endpoint's refusal, a resumable checkpoint, and the failed groups counted in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli_process import finish, start

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AGENT_DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo_agent.yaml"
STOP_BOUND_S = 180.0
"""The run must have ended by itself within this (it is killed after)."""

FAILING_AGENT = '''
async def run(client, example):
    """Asks for more tokens than the model has: the endpoint refuses every request (400)."""
    await client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": example["messages"][-1]["content"]}],
        max_tokens=1_000_000,
    )
    return 0.0
'''


def test_an_agent_that_fails_every_episode_stops_the_run(tmp_path, run_cache):
    (tmp_path / "failing_agent.py").write_text(FAILING_AGENT)  # the user's module, in the cwd
    run_dir = tmp_path / "run"
    proc, stderr = start(
        tmp_path,
        "failing",
        "train",
        str(AGENT_DEMO),
        "environment.run=failing_agent:run",
        f"logging.run_dir={run_dir}",
        f"logging.cache_dir={run_cache}",
        "logging.progress=false",
        "model.warm_start.steps=5",
    )
    code, err = finish(proc, stderr, bound_s=STOP_BOUND_S)
    assert code == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    line = errors[0]
    assert line.startswith("error: no progress: the last ")
    assert "the cause seen most is agent_crashes" in line
    assert "context_length_exceeded" in line and "maximum context length is 512 tokens" in line
    assert "fix the agent (environment.run or environment.command)" in line
    assert f"continue with: zbrl resume {run_dir}" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed_groups_by_cause"]["agent_crashes"] >= 256
    assert set(summary["failed_groups_by_cause"]) == {"agent_crashes"}
    assert "context_length_exceeded" in summary["first_failure_by_cause"]["agent_crashes"]
    assert summary["checkpoint"] is not None
