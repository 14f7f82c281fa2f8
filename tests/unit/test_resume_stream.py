"""Resuming (or restarting the consumers) from a checkpoint at max_staleness >= 1 loses and
repeats no sample: the buffer's state, taken between two steps as the consumer's checkpoint
takes it, plus each producer's resume point, continue every producer's prompt stream exactly
where the trained steps left it, whatever was generated or trained after the checkpoint."""

from __future__ import annotations

import random

import pytest
import torch
from role_settings import buffer_settings

from zbrl.transport.buffer import RolloutBuffer
from zbrl.types import RolloutGroup


def group(ticket: int, version: int, producer: int, prompt: int) -> RolloutGroup:
    return RolloutGroup(
        uid=f"{producer}:{prompt}",
        prompt_ids=[1, 2],
        response_ids=[torch.tensor([3, 4])] * 2,
        behaviour_logprobs=[torch.zeros(2)] * 2,
        rewards=[0.0, 1.0],
        format_acc=[1.0, 1.0],
        ans_acc=[0.0, 1.0],
        truncated=[False, False],
        policy_version=version,
        temperature=1.0,
        producer=producer,
        ticket=ticket,
    )


class Run:
    """Producers taking prompts 0, 1, 2, ... of their own streams, a consumer taking batches,
    interleaved at random (the buffer's protocol, as the real roles follow it)."""

    def __init__(self, rng: random.Random, staleness: int, producers: int, batch: int) -> None:
        self.rng, self.producers, self.batch = rng, producers, batch
        self.buf = RolloutBuffer(
            buffer_settings(groups_per_step=batch, max_staleness=staleness, num_producers=producers)
        )
        self.taken = dict.fromkeys(range(producers), 0)
        self.inflight: dict[int, tuple] = {}
        self.version = 0
        self.trained: list[tuple[int, int, str]] = []  # (step, generating version, uid)

    def until(self, steps: int, on_step=None) -> None:
        while self.version < steps:
            action, p = self.rng.random(), self.rng.randrange(self.producers)
            if action < 0.35 and p not in self.inflight:
                res = self.buf.reserve(p, self.rng.randint(1, 3), timeout=0)
                if res is not None and res.tickets:
                    first = self.taken[p]
                    self.taken[p] += len(res.tickets)
                    self.inflight[p] = (res, first)
            elif action < 0.7 and p in self.inflight:
                res, first = self.inflight.pop(p)
                version = self.rng.randint(res.min_version, self.version)
                groups = [group(t, version, p, first + i) for i, t in enumerate(res.tickets)]
                self.buf.put(groups, {"taken": self.taken[p]})
            else:
                status, got = self.buf.take(self.batch, timeout=0)
                if status == "batch":
                    step = self.version + 1
                    self.trained += [(step, g.policy_version, g.uid) for g in got.groups]
                    self.version = step
                    self.buf.advance_version(step)
                    if on_step is not None:
                        on_step(self)

    def resume_from(self, checkpoint: tuple[int, dict]) -> None:
        """What a resume or a consumer restart does: everything since the checkpoint is gone (the
        logs are cut back to its step); a new buffer continues from its state, and every
        producer from the resume point the buffer returns for it."""
        step, state = checkpoint
        self.trained = [t for t in self.trained if t[0] <= step]
        self.version = step
        self.inflight.clear()
        self.buf = RolloutBuffer(self.buf.settings)
        self.buf.load_state(state)
        points = self.buf.reclaim(None)  # as zbrl.launch.spawn does for every producer
        for p in range(self.producers):  # None (never put anything): from the stream's start
            self.taken[p] = (points.get(p) or {"taken": 0})["taken"]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("staleness", [1, 2])
@pytest.mark.parametrize("producers", [1, 3])
def test_a_resume_at_staleness_continues_every_stream_without_loss_or_repeat(
    seed, staleness, producers
):
    rng = random.Random(seed)
    run = Run(rng, staleness, producers, batch=4)
    saved: list[tuple[int, dict]] = []
    save_at = rng.randint(3, 8)

    def checkpoint(r: Run) -> None:  # the consumer's checkpoint: between two steps
        if r.version == save_at:
            saved.append((r.version, r.buf.state()))

    run.until(save_at + rng.randint(1, 6), on_step=checkpoint)  # trained past it, then died
    assert saved
    before = [t for t in run.trained if t[0] <= save_at]
    run.resume_from(saved[0])
    run.until(24)

    assert run.trained[: len(before)] == before  # the checkpoint's steps stand as trained
    assert [s for s, _, _ in run.trained] == sorted(s for s, _, _ in run.trained)
    assert {s for s, _, _ in run.trained} == set(range(1, 25))
    uids = [uid for _, _, uid in run.trained]
    assert len(uids) == len(set(uids)), "a sample was trained twice"
    for p in range(producers):  # each stream trained in its order, from its first prompt, no gap
        mine = [int(u.split(":")[1]) for u in uids if u.startswith(f"{p}:")]
        assert mine == list(range(len(mine))), f"producer {p} lost a prompt: {mine}"
    assert all(step - 1 - version <= staleness for step, version, _ in run.trained)
