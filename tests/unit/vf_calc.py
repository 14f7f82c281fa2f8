"""A verifiers taskset with tools for the tests of ``environment.type: verifiers``
(test_verifiers_tools.py): additions answered with a calculator the taskset serves as a verifiers
``Toolset`` (an MCP tool server, shared by the taskset's tasks). The harness is zbrl's
``ChatHarness``; the reward is 1 when the reply's last ``<answer>`` is the task's ``answer``.

verifiers starts the tool server as a process of its own (``python -m vf_calc``), hence the
``__main__`` block."""

import asyncio
import re

import verifiers.v1 as vf

from zbrl.rollout.agents.verifiers_harness import ChatHarness


class Calculator(vf.Toolset[vf.SharedToolsetConfig, vf.State]):
    TOOL_PREFIX = None  # the tools are called by their own names: add, divide, wait

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """The sum of two integers."""
        return a + b

    @vf.tool
    async def divide(self, a: int, b: int) -> float:
        """a / b (fails on b = 0)."""
        return a / b

    @vf.tool
    async def wait(self, seconds: float) -> str:
        """Waits, then says so (past the harness's tool deadline: a timeout)."""
        await asyncio.sleep(seconds)
        return "waited"


class CalcData(vf.TaskData):
    answer: str = ""


class CalcTask(vf.Task[CalcData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: CalcData, trace: vf.Trace) -> float:
        found = re.findall(r"<answer>(.*?)</answer>", trace.last_reply or "")
        return float(bool(found) and found[-1] == task.answer)


class CalcTaskset(vf.Taskset[CalcTask, vf.TasksetConfig]):
    @classmethod
    def toolsets(cls, config: vf.TasksetConfig) -> list[vf.Toolset]:
        return [Calculator(vf.SharedToolsetConfig())]

    def load(self):
        yield CalcTask(CalcData(prompt="What is 1+1?", answer="2"), self.config.task)


__all__ = ["CalcTaskset", "ChatHarness"]

if __name__ == "__main__":
    Calculator.run()
