"""Retries and hangs of agent episodes: a failed episode is run again with a fresh agent
(``environment.retries``); one that still fails fails its group; a watchdog ends an episode
that makes no request and no progress for ``timeout_s``, even when its agent blocks its event
loop; an agent that never calls fails (``agent_no_calls``)."""

import threading

from episode_stubs import ScriptedBackend, encoded
from role_settings import sampling_params
from test_agent_episodes import agent_runner
from test_endpoint import calc_then_answer


def flaky(failing_attempts):
    """An agent whose first ``failing_attempts`` episodes (over all samples) crash after a
    call; the later ones answer."""
    attempts = []

    async def agent(client, example):
        attempts.append(1)
        doomed = len(attempts) <= failing_attempts
        reply = await client.chat.completions.create(model="policy", messages=example["messages"])
        if doomed:
            raise RuntimeError("the agent's tool service dropped the connection")
        return reply.choices[0].message.content

    return agent, attempts


def test_a_failed_episode_is_run_again_with_a_fresh_agent():
    backend = ScriptedBackend(calc_then_answer)
    agent, attempts = flaky(failing_attempts=2)
    runner = agent_runner(agent, retries=1)
    (group,) = runner.run(backend.generate, [encoded("2*3")], sampling_params(n=3))
    assert len(attempts) == 5  # 3 episodes, 2 of them again
    assert [c.failure for c in group] == [None, None, None]
    assert sorted(c.counts.get("agent_retries", 0) for c in group) == [0, 1, 1]
    # a retried episode is the fresh attempt's tokens alone: one call, one model turn
    assert all(c.counts["turns"] == 1 and len(c.turns) == 1 for c in group)


def test_an_episode_that_fails_every_try_fails_its_group():
    backend = ScriptedBackend(calc_then_answer)
    agent, attempts = flaky(failing_attempts=100)
    runner = agent_runner(agent, retries=2)
    (group,) = runner.run(backend.generate, [encoded("2*3")], sampling_params(n=2))
    assert len(attempts) == 6
    for c in group:
        assert c.failure.startswith("agent_crashes")
        assert c.counts["agent_retries"] == 2 and c.counts["agent_failures"] == 1
    ((_, results),) = runner.score(None, [encoded("2*3").example], [group])
    assert [r.reward for r in results] == [0.0, 0.0]


def test_the_watchdog_ends_an_episode_whose_agent_blocks_its_loop():
    release = threading.Event()

    async def blocking(client, example):
        await client.chat.completions.create(model="policy", messages=example["messages"])
        release.wait(60)  # blocks the agents' event loop: no await, no cancellation
        return "too late"

    backend = ScriptedBackend(calc_then_answer)
    try:
        runner = agent_runner(blocking, timeout_s=0.3)
        (group,) = runner.run(backend.generate, [encoded("2*3")], sampling_params(n=1))
        (c,) = group
        assert c.failure == "agent_timeouts: no request and no progress for 0.3 s"
        assert c.counts["agent_timeouts"] == 1 and c.counts["turns"] == 1
    finally:
        release.set()


def test_an_agent_that_never_calls_fails_its_episode():
    async def lazy(client, example):
        return "42"

    backend = ScriptedBackend(calc_then_answer)
    (group,) = agent_runner(lazy).run(backend.generate, [encoded("2*3")], sampling_params(n=2))
    for c in group:
        assert c.failure == "agent_no_calls: the agent never called"
        assert c.counts["agent_no_calls"] == 1 and c.counts["agent_failures"] == 1
        assert c.counts["turns"] == 0 and c.token_ids.numel() == 0
    assert backend.generated == []
