"""A verifiers taskset for the tests of ``environment.type: verifiers`` (test_verifiers_env.py):
arithmetic questions whose reward is 1 when the reply's ``<answer>`` is the task's ``answer``.
A task whose answer is ``raise`` has a reward that fails (a broken environment)."""

import re

import verifiers.v1 as vf

from zbrl.rollout.agents.verifiers_harness import ChatHarness


class ArithData(vf.TaskData):
    answer: str = ""


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        if task.answer == "raise":
            raise ValueError("the grader is broken")
        found = re.findall(r"<answer>(.*?)</answer>", trace.last_reply or "")
        return float(bool(found) and found[-1] == task.answer)


class ArithTaskset(vf.Taskset[ArithTask, vf.TasksetConfig]):
    def load(self):
        yield ArithTask(ArithData(prompt="What is 1+1?", answer="2"), self.config.task)


__all__ = ["ArithTaskset", "ChatHarness"]
