"""A long-lived agent program (environment.program_lifetime: run): one process serves every
episode, one line of JSON per episode each way, episodes concurrently; if it exits, its running
episodes fail and the next episode starts it again. Starts Python processes that import openai:
slow tier."""

import sys
import textwrap

import pytest
from episode_stubs import EOS, TOKENIZER, ScriptedBackend, encoded
from role_settings import sampling_params
from test_endpoint import SETTINGS, calc_then_answer

from zbrl.rollout.agents.environment import AgentEnvironment, AgentSettings
from zbrl.rollout.agents.launch import AgentLauncher
from zbrl.rollout.agents.program import LongLivedProgram
from zbrl.rollout.endpoint.conversation import Renderer
from zbrl.rollout.endpoint.server import Endpoint
from zbrl.rollout.episodes import EpisodeLimitSettings, EpisodeRunner
from zbrl.rollout.transcripts import ChatTranscript

pytestmark = pytest.mark.slow

PROGRAM = textwrap.dedent(
    """
    import asyncio, json, os, sys
    import openai

    async def episode(msg):
        client = openai.AsyncOpenAI(
            base_url=msg["base_url"], api_key=msg["api_key"], max_retries=0
        )
        messages = msg["example"]["messages"]
        if "DIE" in messages[-1]["content"]:
            print("giving up", file=sys.stderr, flush=True)
            os._exit(3)
        reply = await client.chat.completions.create(model="policy", messages=messages)
        return {"reward": 1.0, "correct": os.getpid() > 0}

    async def one(line):
        msg = json.loads(line)
        try:
            out = {"id": msg["id"], "result": await episode(msg)}
        except Exception as e:
            out = {"id": msg["id"], "error": repr(e)}
        print("log line", flush=True)
        print(json.dumps(out), flush=True)

    async def main():
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        tasks = set()
        while line := await reader.readline():
            task = asyncio.create_task(one(line))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    asyncio.run(main())
    """
)


def test_one_program_serves_every_episode_and_restarts_after_exiting(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(PROGRAM)
    endpoint = Endpoint(Renderer(TOKENIZER, {EOS}), SETTINGS, "policy")
    program = LongLivedProgram([sys.executable, str(script)])
    launcher = AgentLauncher(None, None, program=program)
    runner = EpisodeRunner(
        AgentEnvironment(endpoint, launcher, AgentSettings("segment", 60.0, 0)),
        ChatTranscript(endpoint.renderer.formatter),
        EpisodeLimitSettings(4, 99),
    )
    backend = ScriptedBackend(calc_then_answer)
    params = sampling_params(n=3)
    for _ in range(2):
        groups = runner.run(backend.generate, [encoded("2*3"), encoded("4*5")], params)
        assert [[c.failure for c in g] for g in groups] == [[None] * 3] * 2
        assert all(c.given_reward == 1.0 and c.env_ans_acc == 1.0 for g in groups for c in g)
    assert program.starts == 1 and len(backend.generated) == 12
    (dead,) = runner.run(backend.generate, [encoded("DIE")], sampling_params(n=2))
    for c in dead:
        assert c.failure.startswith("agent_crashes: the agent program exited (3)")
        assert "giving up" in c.failure
    (again,) = runner.run(backend.generate, [encoded("6*7")], params)
    assert [c.failure for c in again] == [None] * 3 and program.starts == 2
