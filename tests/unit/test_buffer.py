import copy
import pickle
import random
import subprocess
import sys
import threading

import pytest
import torch
from role_settings import buffer_settings

from zbrl.transport.buffer import RolloutBuffer
from zbrl.types import PACKED_FIELDS, Reservation, RolloutGroup


def make_group(ticket, version, ans_acc=(0.0, 1.0), truncated=None, producer=0):
    g = len(ans_acc)
    return RolloutGroup(
        uid=f"u{ticket}",
        prompt_ids=[1, 2],
        response_ids=[torch.tensor([3, 4]) for _ in range(g)],
        behaviour_logprobs=[torch.zeros(2) for _ in range(g)],
        rewards=list(ans_acc),
        format_acc=[1.0] * g,
        ans_acc=list(ans_acc),
        truncated=list(truncated or [False] * g),
        policy_version=version,
        temperature=1.0,
        producer=producer,
        ticket=ticket,
    )


def simulate(seed, *, staleness, producers=3, batch=4, filter_range=None, steps=25, ranks=1):
    """Random interleaving of producers and one consumer (or ``ranks`` data-parallel consumer
    ranks, each taking every step's batch), single-threaded; returns trained pairs (step trained
    at, version generated with)."""
    rng = random.Random(seed)
    buf = RolloutBuffer(
        buffer_settings(
            groups_per_step=batch,
            max_staleness=staleness,
            num_producers=producers,
            filter_range=filter_range,
        )
    )
    pending = {p: [] for p in range(producers)}  # reservations not yet generated
    published = 0
    trained = []
    taken = {}  # rank -> this step's batch
    while len({s for s, _ in trained}) < steps:
        action = rng.random()
        p = rng.randrange(producers)
        if action < 0.35:
            res = buf.reserve(p, rng.randint(1, 3), timeout=0)
            if res is not None and res.tickets:
                assert res.min_version <= published
                pending[p].append(res)
        elif action < 0.75 and pending[p]:
            res = pending[p].pop(0)
            version = rng.randint(res.min_version, published)  # any loaded version >= min
            accs = [tuple(rng.choice([0.0, 1.0]) for _ in range(2)) for _ in res.tickets]
            buf.put([make_group(t, version, a, producer=p) for t, a in zip(res.tickets, accs)])
        else:
            rank = rng.choice([r for r in range(ranks) if r not in taken])
            status, got = buf.take(batch, timeout=0, step=published, rank=rank, ranks=ranks)
            if status == "batch":
                assert got.step == buf.version == published
                taken[rank] = got
            if len(taken) == ranks:  # every rank has the step's batch: they train it together
                first = taken[0]
                assert all(b is first or b == first for b in taken.values())
                trained += [(first.step, g.policy_version) for g in first.groups]
                taken.clear()
                published += 1
                buf.advance_version(published)
    return trained, buf


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_no_trained_sample_is_older_than_max_staleness(seed, staleness):
    trained, buf = simulate(seed, staleness=staleness)
    assert trained
    behind = [step - version for step, version in trained]
    assert max(behind) <= staleness
    assert min(behind) >= 0
    assert buf.stats.groups_dropped_stale == 0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_staleness_bound_holds_for_data_parallel_ranks(seed, staleness):
    trained, buf = simulate(seed, staleness=staleness, ranks=3, steps=15)
    behind = [step - version for step, version in trained]
    assert max(behind) <= staleness and min(behind) >= 0
    assert buf.stats.groups_dropped_stale == 0
    assert buf.stats.groups_trained == len(trained) == 15 * 4  # each batch counted once
    assert not buf._shared  # every rank took every step's batch


def test_ranks_waiting_together_get_one_batch():
    """Ranks blocked in take at the same time: one batch is popped, every rank gets it."""
    buf = RolloutBuffer(buffer_settings(groups_per_step=2, max_staleness=1, num_producers=1))
    got = {}

    def rank_take(rank):
        got[rank] = buf.take(2, 10.0, 0, rank, 3)

    threads = [threading.Thread(target=rank_take, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    res = buf.reserve(0, 4, timeout=0)
    buf.put([make_group(t, 0) for t in res.tickets])  # two batches' worth
    for t in threads:
        t.join(timeout=10)
    assert [got[r][0] for r in range(3)] == ["batch"] * 3
    assert got[0][1] is got[1][1] is got[2][1]
    assert [g.ticket for g in got[0][1].groups] == res.tickets[:2]
    assert buf.stats.groups_trained == 2


def test_ranks_share_the_end_of_data_and_must_keep_lockstep():
    buf = RolloutBuffer(buffer_settings(groups_per_step=2, max_staleness=0, num_producers=1))
    res = buf.reserve(0, 2, timeout=0)
    buf.put([make_group(t, 0) for t in res.tickets])
    one = buf.take(2, timeout=0, step=0, rank=1, ranks=2)
    with pytest.raises(ValueError, match="twice"):
        buf.take(2, timeout=0, step=0, rank=1, ranks=2)
    assert buf.take(2, timeout=0, step=0, rank=0, ranks=2) == one
    buf.producer_finished(0)
    with pytest.raises(ValueError, match="lockstep"):
        buf.take(2, timeout=0, step=2, rank=0, ranks=2)  # step 2 at version 0
    buf.advance_version(1)
    buf.close()  # rank 0 finished and closed: rank 1 still gets the shared end
    assert buf.take(2, timeout=0, step=1, rank=0, ranks=2) == ("end", None)
    assert buf.take(2, timeout=0, step=1, rank=1, ranks=2) == ("end", None)


@pytest.mark.parametrize("seed", range(8))
def test_staleness_zero_is_on_policy(seed):
    trained, _ = simulate(seed, staleness=0)
    assert all(step == version for step, version in trained)


@pytest.mark.parametrize("seed", range(4))
def test_staleness_bound_holds_with_filtering(seed):
    trained, buf = simulate(seed, staleness=1, filter_range=(0.01, 0.99))
    assert max(step - v for step, v in trained) <= 1
    assert buf.stats.groups_filtered_accuracy > 0


def test_admission_capacity_rule():
    buf = RolloutBuffer(buffer_settings(groups_per_step=4, max_staleness=1, num_producers=1))
    res = buf.reserve(0, 100, timeout=0)
    assert len(res.tickets) == 8  # (version 0 + 1 + 1) * 4
    assert buf.reserve(0, 1, timeout=0).tickets == []  # full: producer must wait
    buf.put([make_group(t, 0) for t in res.tickets])
    status, batch = buf.take(4, timeout=0)
    assert status == "batch" and len(batch.groups) == 4
    assert buf.reserve(0, 1, timeout=0).tickets == []  # consumer has not advanced yet
    buf.advance_version(1)
    more = buf.reserve(0, 100, timeout=0)
    assert more.tickets == [8, 9, 10, 11]
    assert more.min_version == 1  # last effective index 11 // 4 - 1


def test_asking_for_a_step_advances_admission_to_it():
    """A consumer sends advance_version without waiting; its take of step k must not find the
    buffer behind k even when the advance has not run yet."""
    buf = RolloutBuffer(buffer_settings(groups_per_step=2, max_staleness=0, num_producers=1))
    res = buf.reserve(0, 100, timeout=0)
    buf.put([make_group(t, 0) for t in res.tickets])
    assert buf.take(2, timeout=0, step=0)[0] == "batch"
    assert buf.reserve(0, 1, timeout=0).tickets == []  # version 0: no admission
    assert buf.take(2, timeout=0, step=1) == ("timeout", None)
    assert buf.version == 1
    assert buf.reserve(0, 100, timeout=0).tickets == [2, 3]
    buf.advance_version(1)  # arriving late changes nothing
    assert buf.version == 1


def test_filtered_groups_free_their_slots_and_are_counted():
    buf = RolloutBuffer(
        buffer_settings(
            groups_per_step=2, max_staleness=0, num_producers=1, filter_range=(0.01, 0.99)
        )
    )
    res = buf.reserve(0, 10, timeout=0)
    assert len(res.tickets) == 2
    buf.put([make_group(res.tickets[0], 0, (1.0, 1.0)), make_group(res.tickets[1], 0)])
    assert buf.stats.groups_filtered_accuracy == 1
    again = buf.reserve(0, 10, timeout=0)
    assert len(again.tickets) == 1  # the filtered group's slot is free again
    buf.put([make_group(again.tickets[0], 0)])
    status, batch = buf.take(2, timeout=0)
    assert status == "batch" and [g.ticket for g in batch.groups] == [1, 2]
    assert batch.raw_groups == 3
    snap = buf.snapshot()
    assert snap["sample_utilization"] == pytest.approx(4 / 6)
    assert batch.sample_utilization == snap["sample_utilization"]  # the batch carries it


def test_take_waits_for_ticket_order():
    buf = RolloutBuffer(buffer_settings(groups_per_step=2, max_staleness=0, num_producers=2))
    a = buf.reserve(0, 1, timeout=0)
    b = buf.reserve(1, 1, timeout=0)
    buf.put([make_group(b.tickets[0], 0, producer=1)])
    assert buf.take(2, timeout=0) == ("timeout", None)  # ticket 0 still pending
    buf.put([make_group(a.tickets[0], 0)])
    status, batch = buf.take(2, timeout=0)
    assert status == "batch"
    assert [g.ticket for g in batch.groups] == [0, 1]


def test_end_of_data_returns_partial_batch_then_end():
    buf = RolloutBuffer(buffer_settings(groups_per_step=4, max_staleness=0, num_producers=1))
    res = buf.reserve(0, 4, timeout=0)
    buf.put([make_group(t, 0) for t in res.tickets[:3]])
    buf.release(res.tickets[3:])
    assert buf.take(4, timeout=0) == ("timeout", None)  # producer may still send more
    buf.producer_finished(0)
    status, batch = buf.take(4, timeout=0)
    assert status == "batch" and batch.partial and len(batch.groups) == 3
    assert buf.take(4, timeout=0) == ("end", None)
    assert buf.stats.partial_batches == 1 and buf.stats.tickets_released == 1


def test_close_wakes_blocked_producer():
    buf = RolloutBuffer(buffer_settings(groups_per_step=1, max_staleness=0, num_producers=1))
    buf.reserve(0, 1, timeout=0)
    result = {}

    def blocked():
        result["res"] = buf.reserve(0, 1, timeout=30)

    t = threading.Thread(target=blocked)
    t.start()
    buf.close()
    t.join(timeout=10)
    assert not t.is_alive() and result["res"] is None


def test_unknown_ticket_is_rejected():
    buf = RolloutBuffer(buffer_settings(groups_per_step=1, max_staleness=0, num_producers=1))
    with pytest.raises(ValueError, match="unknown or used ticket"):
        buf.put([make_group(5, 0)])


def test_stale_group_is_dropped_at_take():
    buf = RolloutBuffer(buffer_settings(groups_per_step=1, max_staleness=0, num_producers=1))
    res = buf.reserve(0, 1, timeout=0)
    buf.advance_version(3)  # simulate a misbehaving producer that ignored min_version
    buf.put([make_group(res.tickets[0], 0)])
    buf.producer_finished(0)
    assert buf.take(1, timeout=0) == ("end", None)
    assert buf.stats.groups_dropped_stale == 1


def test_rollout_group_pickles_to_flat_tensors_and_back():
    group = make_group(3, 1, ans_acc=(0.0, 1.0, 1.0))
    group.response_ids = [
        torch.tensor([5]),
        torch.tensor([], dtype=torch.long),
        torch.tensor([7, 8, 9]),
    ]
    group.behaviour_logprobs = [
        torch.tensor([-0.5]),
        torch.tensor([]),
        torch.tensor([-1.0, -2.0, -3.0]),
    ]
    back = pickle.loads(pickle.dumps(group))
    assert [t.tolist() for t in back.response_ids] == [[5], [], [7, 8, 9]]
    assert [t.tolist() for t in back.behaviour_logprobs] == [[-0.5], [], [-1.0, -2.0, -3.0]]
    assert back.response_ids[2].dtype == torch.long and back.ans_acc == group.ans_acc
    assert back.response_lengths == [1, 0, 3]


BUFFER_PROCESS = """
import pickle, sys
from zbrl.transport.buffer import BufferSettings, RolloutBuffer
groups = pickle.loads(sys.stdin.buffer.read())
buf = RolloutBuffer(BufferSettings(
    groups_per_step=2, max_staleness=1, num_producers=1, filter_range=None,
    dynamic_batching=False, drop_all_truncated_groups=False, capacity=None))
res = buf.reserve(0, len(groups), timeout=0)
for group, ticket in zip(groups, res.tickets):
    group.ticket = ticket
buf.put(groups)
held = pickle.loads(pickle.dumps(buf.state()))  # a checkpoint of the buffer, groups pending
status, batch = buf.take(2, timeout=0)
print(status, buf.stats.samples_generated, [g.group_size for g in batch.groups],
      [g.response_lengths for g in batch.groups], "torch" in sys.modules, file=sys.stderr)
sys.stdout.buffer.write(pickle.dumps(batch))
"""


def test_the_buffers_process_takes_holds_and_passes_on_groups_without_torch():
    """Groups pickled by a producer are reserved, put, checkpointed and taken in a process that
    never imports torch (the rollout buffer's: types.PACKED_FIELDS), and reach the consumer with
    every token, log-prob and loss mask as they were sent."""
    sent = [make_group(-1, 0, ans_acc=(0.0, 1.0)) for _ in range(2)]
    sent[0].response_ids = [torch.tensor([5, 6, 7]), torch.tensor([], dtype=torch.long)]
    sent[0].behaviour_logprobs = [torch.tensor([-0.5, -1.5, -2.5]), torch.tensor([])]
    sent[1].loss_masks = [torch.tensor([True, False]), torch.tensor([False, True])]
    out = subprocess.run(
        [sys.executable, "-c", BUFFER_PROCESS],
        input=pickle.dumps(sent),
        capture_output=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stderr.decode().split("\n")[0] == "batch 4 [2, 2] [[3, 0], [2, 2]] False"
    got = pickle.loads(out.stdout).groups
    for a, b in zip(sent, got):
        for field in PACKED_FIELDS:
            if getattr(a, field) is None:
                assert getattr(b, field) is None
                continue
            assert [t.dtype for t in getattr(b, field)] == [t.dtype for t in getattr(a, field)]
            assert [t.tolist() for t in getattr(b, field)] == [
                t.tolist() for t in getattr(a, field)
            ]
    assert [g.uid for g in got] == [g.uid for g in sent]


def test_a_group_pickled_by_an_older_zbrl_still_loads():
    """Checkpoints written before the NumPy wire format hold flat tensors; they load as before."""
    group = make_group(3, 1)
    state = dict(group.__dict__)
    state["response_ids"] = (torch.tensor([3, 4, 3, 4]), [2, 2])
    state["behaviour_logprobs"] = (torch.zeros(4), [2, 2])
    state["loss_masks"] = state["token_versions"] = None
    old = RolloutGroup.__new__(RolloutGroup)
    old.__setstate__(state)
    assert [t.tolist() for t in old.response_ids] == [[3, 4], [3, 4]]
    assert old.group_size == 2 and old.loss_masks is None


def drive(buf, rng, pending, ops):
    """Random producer/consumer calls on ``buf`` (two producers, batch 2); a log of results."""
    log = []
    for _ in range(ops):
        action, p = rng.random(), rng.randrange(2)
        if action < 0.3:
            res = buf.reserve(p, rng.randint(1, 3), timeout=0)
            log.append(("reserve", p, res.tickets, res.min_version))
            if res.tickets:
                pending[p].append(res)
        elif action < 0.65 and pending[p]:
            res = pending[p].pop(0)
            version = rng.randint(res.min_version, max(res.min_version, buf.version))
            accs = [tuple(rng.choice([0.0, 1.0]) for _ in range(2)) for _ in res.tickets]
            buf.put([make_group(t, version, a, producer=p) for t, a in zip(res.tickets, accs)])
        elif action < 0.7 and pending[p]:
            buf.release(pending[p].pop(0).tickets)
        else:
            log.append(take_log(buf))
    for p in (0, 1):
        for res in pending[p]:
            buf.release(res.tickets)
        buf.producer_finished(p)
    while not log or log[-1][0] != "end":
        log.append(take_log(buf))
    return [*log, ("snapshot", buf.snapshot())]


def take_log(buf):
    status, batch = buf.take(2, timeout=0)
    if batch is None:
        return (status,)
    buf.advance_version(buf.version + 1)
    groups = [(g.uid, g.policy_version) for g in batch.groups]
    return (status, groups, batch.step, batch.raw_groups, batch.raw_metrics, batch.partial)


def test_buffer_state_round_trip_continues_exactly():
    settings = buffer_settings(
        groups_per_step=2, max_staleness=1, num_producers=2, filter_range=(0.01, 0.99)
    )
    original = RolloutBuffer(settings)
    r0, r1 = original.reserve(0, 3, timeout=0), original.reserve(1, 1, timeout=0)
    assert (r0.tickets, r1.tickets) == ([0, 1, 2], [3])
    original.put([make_group(0, 0), make_group(1, 0, (1.0, 1.0))])  # ticket 1 is filtered
    original.put([make_group(3, 0, producer=1)])
    assert original.take(2, timeout=0) == ("timeout", None)  # ticket 2 is still pending
    state = pickle.loads(pickle.dumps(original.state()))
    assert sorted(state["ready"]) == [0, 3] and state["pending"] == [2]
    assert state["dropped_tickets"] == [1] and state["dropped"] == 1
    assert state["stats"]["groups_filtered_accuracy"] == 1 and len(state["raw"]) == 3

    resumed = RolloutBuffer(settings)
    resumed.load_state(state)
    assert resumed.snapshot() == original.snapshot()
    in_flight = {0: [Reservation(tickets=[2], min_version=r0.min_version)], 1: []}
    expected = drive(original, random.Random(5), copy.deepcopy(in_flight), ops=120)
    got = drive(resumed, random.Random(5), copy.deepcopy(in_flight), ops=120)
    assert got == expected
    assert sum(entry[0] == "batch" for entry in got) >= 5
    assert any(entry[0] == "reserve" and entry[2] for entry in got)


def test_loaded_buffer_differs_from_a_fresh_one():
    """The round trip above can fail: a fresh buffer grants other tickets."""
    settings = buffer_settings(groups_per_step=2, max_staleness=1, num_producers=1)
    original = RolloutBuffer(settings)
    original.reserve(0, 3, timeout=0)
    resumed, fresh = RolloutBuffer(settings), RolloutBuffer(settings)
    resumed.load_state(original.state())
    assert resumed.reserve(0, 5, timeout=0).tickets == original.reserve(0, 5, timeout=0).tickets
    assert fresh.reserve(0, 5, timeout=0).tickets != resumed.reserve(0, 5, timeout=0).tickets


def simulate_with_deaths(seed, *, staleness, producers=3, batch=4, steps=30):
    """Random interleaving in which producers also die: a dead producer's pending reservation is
    reclaimed and it restarts from the resume point it last sent with a ``put`` (a count of the
    prompts of its stream it has pushed). Returns (step, version, prompt) of every trained group."""
    rng = random.Random(seed)
    buf = RolloutBuffer(
        buffer_settings(groups_per_step=batch, max_staleness=staleness, num_producers=producers)
    )
    taken = dict.fromkeys(range(producers), 0)  # prompts each producer took from its stream
    inflight: dict[int, tuple] = {}  # producer -> (reservation, its prompts)
    published, trained, deaths = 0, [], 0
    while len({s for s, _, _ in trained}) < steps:
        action, p = rng.random(), rng.randrange(producers)
        if action < 0.3 and p not in inflight:
            res = buf.reserve(p, rng.randint(1, 3), timeout=0)
            if res is not None and res.tickets:
                prompts = [(p, taken[p] + i) for i in range(len(res.tickets))]
                taken[p] += len(res.tickets)
                inflight[p] = (res, prompts)
        elif action < 0.6 and p in inflight:
            res, prompts = inflight.pop(p)
            version = rng.randint(res.min_version, published)
            groups = [make_group(t, version, producer=p) for t in res.tickets]
            for g, prompt in zip(groups, prompts):
                g.uid = f"{prompt[0]}:{prompt[1]}"
            buf.put(groups, {"taken": taken[p]})
        elif action < 0.68:  # the producer dies, whatever it was doing
            deaths += 1
            inflight.pop(p, None)
            state = buf.reclaim(p)[p]
            taken[p] = 0 if state is None else state["taken"]
        else:
            status, got = buf.take(batch, timeout=0)
            if status == "batch":
                trained += [(got.step, g.policy_version, g.uid) for g in got.groups]
                published += 1
                buf.advance_version(published)
    assert deaths > 0
    return trained


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("staleness", [0, 2])
def test_reclaimed_producers_lose_nothing_and_repeat_nothing(seed, staleness):
    trained = simulate_with_deaths(seed, staleness=staleness)
    assert max(step - version for step, version, _ in trained) <= staleness
    uids = [uid for _, _, uid in trained]
    assert len(uids) == len(set(uids)), "a prompt was trained twice"
    for p in range(3):  # each producer's trained prompts: its stream's order, with no gap
        mine = [int(u.split(":")[1]) for u in uids if u.startswith(f"{p}:")]
        assert mine == list(range(len(mine)))


def test_stop_keeps_what_is_buffered_and_turns_producers_away():
    buf = RolloutBuffer(buffer_settings(groups_per_step=2, max_staleness=1, num_producers=1))
    res = buf.reserve(0, 4, timeout=0)
    buf.put([make_group(t, 0) for t in res.tickets[:2]], {"taken": 2})
    buf.request_stop()
    assert buf.take(2, timeout=0) == ("stop", None)
    assert buf.reserve(0, 1, timeout=0) is None
    state = buf.state()
    assert sorted(state["ready"]) == [0, 1] and state["pending"] == [2, 3]
    assert state["owners"] == {2: 0, 3: 0} and state["producer_states"] == {0: {"taken": 2}}
    resumed = RolloutBuffer(buf.settings)
    resumed.load_state(state)
    assert resumed.reclaim() == {0: {"taken": 2}}
    assert resumed.stats.tickets_reissued == 2
    status, batch = resumed.take(2, timeout=0)  # the pending tickets no longer block the head
    assert status == "batch" and [g.ticket for g in batch.groups] == [0, 1]
    # their admission is given back: (version 0 + 1 + 1) * 2 effective tickets, 2 started
    assert resumed.reserve(0, 4, timeout=0).tickets == [4, 5]


@pytest.mark.parametrize("producers", [1, 2])
def test_a_batch_counts_the_producers_parked_for_the_whole_step(producers):
    buf = RolloutBuffer(
        buffer_settings(groups_per_step=2, max_staleness=0, num_producers=producers)
    )
    nodes = ["A", "B"][:producers]
    tickets = [buf.reserve(p, 1, timeout=0, node=node).tickets for p, node in enumerate(nodes)]
    if producers == 1:
        tickets.append(buf.reserve(0, 1, timeout=0, node="A").tickets)
    assert buf.reserve(0, 1, timeout=0, node="A").tickets == []  # no room left
    buf.put([make_group(tickets[0][0], 0)])
    # a ticket is still in flight: its producer is working, and a filtered put could free room
    assert buf.take(2, timeout=0, node="A") == ("timeout", None)
    buf.put([make_group(tickets[1][0], 0, producer=producers - 1)])
    status, batch = buf.take(2, timeout=0, node="A")
    assert status == "batch" and batch.parked_producers == 1  # every producer idle; 1 on A
    buf.advance_version(1)
    res = buf.reserve(0, 2, timeout=0, node="A")
    buf.put([make_group(t, 1) for t in res.tickets])
    assert buf.take(2, timeout=0, step=1, node="C")[1].parked_producers == 0  # none on C


def test_no_lending_while_admission_has_room():
    buf = RolloutBuffer(buffer_settings(groups_per_step=2, max_staleness=1, num_producers=1))
    res = buf.reserve(0, 2, timeout=0, node="A")  # 2 of the 4 admitted tickets
    buf.put([make_group(t, 0) for t in res.tickets])
    assert buf.take(2, timeout=0, node="A")[1].parked_producers == 0  # it may generate more


def test_failed_episodes_are_their_own_reason_and_step_metric():
    """A group with a failed episode is dropped under ``failed_episodes`` (not
    ``reward_failed``), counted per episode in the step's pre-filter metrics, and its placeholder
    reward (0) is left out of the pre-filter reward mean."""
    settings = buffer_settings(groups_per_step=2, max_staleness=0, num_producers=1)
    buf = RolloutBuffer(settings)
    first, second = buf.reserve(0, 2, timeout=0).tickets
    bad = make_group(second, 0, ans_acc=(0.0, 0.0, 1.0))
    bad.episode_failures = 2
    buf.put([make_group(first, 0, ans_acc=(0.0, 1.0)), bad])
    resumed = RolloutBuffer(settings)  # the figures survive a resume
    resumed.load_state(pickle.loads(pickle.dumps(buf.state())))
    (replacement,) = resumed.reserve(0, 2, timeout=0).tickets  # the drop freed one ticket
    resumed.put([make_group(replacement, 0, ans_acc=(1.0, 1.0))])
    status, batch = resumed.take(2, timeout=0)
    assert status == "batch" and [g.ticket for g in batch.groups] == [first, replacement]
    assert batch.raw_groups == 3
    assert batch.raw_metrics["reward"] == pytest.approx((0.5 + 1.0) / 2)  # not (0.5+1/3+1)/3
    assert batch.raw_metrics["failed_episodes"] == 2.0
    assert batch.raw_metrics["reward_failed"] == 0.0
    stats = resumed.stats
    assert stats.per_reason == {"failed_episodes": 1}
    assert (stats.groups_failed_episodes, stats.episodes_failed) == (1, 2)
    assert stats.groups_dropped_reward_failed == 0


def test_summary_reports_every_drop_reason_of_the_buffer():
    """summary.json's ``groups_dropped`` names the buffer's own reasons, with its counts."""
    from zbrl.launch.summary import groups_dropped

    buf = RolloutBuffer(buffer_settings(groups_per_step=3, max_staleness=0, num_producers=1))
    first, second, third = buf.reserve(0, 3, timeout=0).tickets
    failed_episode = make_group(second, 0)
    failed_episode.episode_failures = 1
    failed_reward = make_group(third, 0)
    failed_reward.reward_failed = 1
    buf.put([make_group(first, 0), failed_episode, failed_reward])
    dropped = groups_dropped(buf.snapshot())
    assert dropped == {
        "reward_failed": 1,
        "failed_episodes": 1,
        "accuracy_out_of_range": 0,
        "all_truncated": 0,
        "stale": 0,
    }
    assert {k: v for k, v in dropped.items() if v} == buf.stats.per_reason
