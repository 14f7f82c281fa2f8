"""A verifiers taskset for the verifiers demo (recipes/demo_verifiers.yaml, docs/agents.md): the
embedded addition task, scored by its own reward.

zbrl makes each sample of the run's data into an ``AdditionTask`` (the sample's ``messages`` as
the prompt, its ``gt_answer`` as ``answer``: ``environment.fields``); verifiers plays it with the
in-process ``ChatHarness`` exported below and scores the trace with ``correct``. ``load`` is the
taskset's own data for verifiers' tools (``vf-eval`` and the like): a few problems in the same
format.
"""

from __future__ import annotations

import re

import verifiers.v1 as vf

from zbrl.rollout.agents.verifiers_harness import ChatHarness

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class AdditionData(vf.TaskData):
    answer: str = ""
    """The sum, as text."""


class AdditionTask(vf.Task[AdditionData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: AdditionData, trace: vf.Trace) -> float:
        """1 when the reply's last ``<answer>…</answer>`` is the sum, else 0."""
        found = ANSWER.findall(trace.last_reply or "")
        return float(bool(found) and found[-1].strip() == task.answer)


class AdditionTaskset(vf.Taskset[AdditionTask, vf.TasksetConfig]):
    def load(self):
        for a, b in [(12, 30), (7, 58), (41, 41)]:
            prompt = [
                {"role": "system", "content": "Format: <think></think><answer></answer>"},
                {"role": "user", "content": f"What is {a}+{b}?"},
            ]
            yield AdditionTask(AdditionData(prompt=prompt, answer=str(a + b)), self.config.task)


__all__ = ["AdditionTaskset", "ChatHarness"]
