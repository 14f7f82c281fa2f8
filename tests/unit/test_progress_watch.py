"""No progress, no run: the buffer counts failed groups per cause and the streak of groups that
all failed; the driver's watch decides from them (and the time since the last step) when a run
that trains nothing stops, and says why in one line."""

import math
from dataclasses import replace

from role_settings import buffer_settings
from test_buffer import make_group

from zbrl.config.progress import NoProgress
from zbrl.launch.progress_watch import ProgressWatch, fix_for
from zbrl.rewards.base import RewardResult, failed_result
from zbrl.rollout.producer import first_failure
from zbrl.transport.buffer import RolloutBuffer
from zbrl.transport.failure_log import FailureLog

REFUSED = "agent_crashes: BadRequestError: Error code: 400 - stream: true is not supported"


def failing(ticket, failure, *, episodes=True):
    group = make_group(ticket, 0)
    if episodes:
        return replace(group, episode_failures=2, failure=failure)
    return replace(group, reward_failed=1, rewards=[math.nan, 1.0], failure=failure)


def test_the_buffer_logs_failed_groups_per_cause_and_the_streak():
    buf = RolloutBuffer(buffer_settings(groups_per_step=8, max_staleness=0, num_producers=1))
    t = buf.reserve(0, 8, timeout=0).tickets
    buf.put([failing(t[0], REFUSED), failing(t[1], "agent_crashes: RuntimeError: second")])
    buf.put([failing(t[2], "reward_failed: the service did not answer", episodes=False)])
    log = buf.failure_log()
    assert log["groups"] == {"agent_crashes": 2, "reward_failed": 1}
    assert log["first"]["agent_crashes"] == REFUSED  # the first message, not the latest
    assert log["streak"] == 3 and log["streak_groups"] == log["groups"]
    assert buf.stats.groups_failed_episodes == 2 and buf.stats.groups_dropped_reward_failed == 1
    buf.put([make_group(t[3], 0)])  # a scored group ends the streak, the totals stay
    log = buf.failure_log()
    assert (log["streak"], log["streak_since"], log["groups"]["agent_crashes"]) == (0, None, 2)
    buf.put([failing(t[4], "agent_timeouts: past 60 s")])
    assert buf.failure_log()["streak_groups"] == {"agent_timeouts": 1}


def test_a_group_names_its_first_failure():
    ok = RewardResult(1.0, 1.0, 1.0)
    bad = failed_result("HTTP 503 from http://reward")
    assert first_failure([], [ok, ok]) is None
    assert first_failure([], [ok, bad]) == "reward_failed: HTTP 503 from http://reward"


def streak_of(n, cause="agent_crashes", since=0.0):
    log = FailureLog()
    for i in range(n):
        log.failed(f"{cause}: failure {i}", now=since + i * 0.01)
    return log.as_dict()


def test_a_streak_of_failed_groups_stops_the_run_once_long_enough():
    watch = ProgressWatch(NoProgress(max_failed_groups=10, min_failing_s=30), 0, step_at=0.0)
    assert watch.verdict(0, 20.0, streak_of(50)) is None  # many, but an 8 s..30 s outage
    assert watch.verdict(0, 40.0, streak_of(9)) is None  # long, but too few
    line = watch.verdict(0, 40.0, streak_of(10))
    assert line.startswith("no progress: the last 10 groups all failed, over 40 s")
    assert "the cause seen most is agent_crashes (10 of 10 failed groups)" in line
    assert "first: agent_crashes: failure 0;" in line
    assert line.endswith(fix_for("agent_crashes")) and "\n" not in line


def test_the_cause_seen_most_is_named_with_the_others():
    log = FailureLog()
    for i in range(12):
        cause = "reward_failed" if i % 3 else "agent_timeouts"
        log.failed(f"{cause}: detail {i}\n  on two lines", now=float(i))
    watch = ProgressWatch(NoProgress(max_failed_groups=12, min_failing_s=5), 0, step_at=0.0)
    line = watch.verdict(0, 60.0, log.as_dict())
    assert (
        "the cause seen most is reward_failed (8 of 12 failed groups; also agent_timeouts (4))"
        in line
    )
    assert "first: reward_failed: detail 1 on two lines;" in line
    assert "reward.timeout_s" in line


def test_time_without_a_step_stops_the_run_and_a_step_resets_it():
    watch = ProgressWatch(NoProgress(max_s_without_step=100), 3, step_at=0.0)
    quiet = FailureLog().as_dict()
    assert watch.verdict(3, 99.0, quiet) is None
    assert watch.verdict(4, 150.0, quiet) is None  # a step at 150 s
    assert watch.verdict(4, 249.0, quiet) is None
    line = watch.verdict(4, 250.0, quiet)
    assert line.startswith("no progress: no step was trained in 100 s")
    assert "no group failed" in line
    some = streak_of(3, "tool_server_down")
    line = watch.verdict(4, 250.0, some)
    assert "the cause seen most is tool_server_down (3 of 3 failed groups)" in line
    assert "fix the environment" in line


def test_a_bound_set_to_none_never_stops():
    no_count = ProgressWatch(NoProgress(max_failed_groups=None), 0, step_at=0.0)
    assert no_count.verdict(0, 1000.0, streak_of(10_000)) is None  # within the 1800 s bound
    no_clock = ProgressWatch(NoProgress(max_s_without_step=None), 0, step_at=0.0)
    assert no_clock.verdict(0, 1e6, FailureLog().as_dict()) is None


def test_the_defaults_let_a_short_outage_train():
    """A reward service down for 8 s fails every group it scores then; at the defaults even
    a thousand such groups do not stop the run."""
    watch = ProgressWatch(NoProgress(), 0, step_at=0.0)
    assert watch.verdict(0, 8.0, streak_of(1000, "reward_failed")) is None
