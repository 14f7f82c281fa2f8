"""Typed clients: each call reaches its target's method (in-process handles, no Ray)."""

import re
from pathlib import Path

import pytest
import torch
from role_settings import buffer_settings

from zbrl.telemetry.hub import TelemetryHub
from zbrl.transport.buffer import RolloutBuffer
from zbrl.transport.clients import BufferClient, HubClient, WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.store import WeightStore
from zbrl.types import RolloutGroup, WeightsMessage


class RecordingHandle(LocalHandle):
    """Records the methods a client passes (functions of the target class, never strings)."""

    def __init__(self, target):
        super().__init__(target)
        self.methods = []

    def call(self, method, *args, timeout=None):
        self.methods.append(method)
        return super().call(method, *args, timeout=timeout)

    def send(self, method, *args):
        self.methods.append(method)
        return super().send(method, *args)


def group(ticket):
    return RolloutGroup(
        uid=f"u{ticket}",
        prompt_ids=[1],
        response_ids=[torch.tensor([2]), torch.tensor([3])],
        behaviour_logprobs=[torch.zeros(1), torch.zeros(1)],
        rewards=[0.0, 1.0],
        format_acc=[1.0, 1.0],
        ans_acc=[0.0, 1.0],
        truncated=[False, False],
        policy_version=0,
        temperature=1.0,
        producer=0,
        ticket=ticket,
    )


def test_buffer_client_drives_the_buffer():
    handle = RecordingHandle(
        RolloutBuffer(buffer_settings(groups_per_step=2, max_staleness=0, num_producers=1))
    )
    client = BufferClient(handle)
    res = client.reserve(0, 3, 0)
    assert res.tickets == [0, 1]
    client.put([group(0)])
    client.release([1])
    client.producer_finished(0)
    status, batch = client.take(2, 0)
    assert status == "batch" and batch.partial and [g.uid for g in batch.groups] == ["u0"]
    assert batch.sample_utilization == 1.0  # both samples generated were trained
    client.advance_version(1)  # sent without waiting
    assert client.snapshot()["version"] == 1.0
    client.close()
    assert client.reserve(0, 1, 0) is None
    assert handle.methods[:8] == [
        RolloutBuffer.reserve,
        RolloutBuffer.put,
        RolloutBuffer.release,
        RolloutBuffer.producer_finished,
        RolloutBuffer.take,
        RolloutBuffer.advance_version,
        RolloutBuffer.snapshot,
        RolloutBuffer.close,
    ]


class DeferredHandle(LocalHandle):
    """``send`` runs nothing until the result is asked for (a remote call still on its way);
    records when each call runs."""

    def __init__(self, target):
        super().__init__(target)
        self.ran = []

    def call(self, method, *args, timeout=None):
        self.ran.append(method.__name__)
        return super().call(method, *args, timeout=timeout)

    def send(self, method, *args):
        handle = self

        class Later:
            def result(self, timeout=None):
                handle.ran.append(method.__name__)
                return LocalHandle.call(handle, method, *args)

        return Later()


def test_put_is_sent_without_waiting_and_settled_by_the_next_producer_call():
    buffer = RolloutBuffer(buffer_settings(groups_per_step=2, max_staleness=0, num_producers=1))
    handle = DeferredHandle(buffer)
    client = BufferClient(handle)
    assert client.reserve(0, 1, 0).tickets == [0]
    client.put([group(0)])
    assert handle.ran == ["reserve"]  # the put is still on its way
    assert client.reserve(0, 1, 0).tickets == [1]
    assert handle.ran == ["reserve", "reserve", "put"]  # the reservation first, then the put
    client.put([group(1)])
    client.producer_finished(0)
    assert handle.ran[-2:] == ["put", "producer_finished"]  # every put lands before
    status, batch = client.take(2, 0)
    assert status == "batch" and [g.uid for g in batch.groups] == ["u0", "u1"]


def test_an_error_of_a_put_comes_out_of_the_next_producer_call():
    buffer = RolloutBuffer(buffer_settings(groups_per_step=2, max_staleness=0, num_producers=1))
    client = BufferClient(DeferredHandle(buffer))
    client.put([group(5)])  # ticket 5 was never granted
    with pytest.raises(ValueError, match="unknown or used ticket 5"):
        client.reserve(0, 1, 0)


def test_weight_store_client_announces_and_fetches():
    client = WeightStoreClient(RecordingHandle(WeightStore()))
    assert client.latest() is None and client.latest_version() == -1
    payload = client.put_payload({"w": torch.ones(2)})
    assert client.announce(WeightsMessage(2, 0.0, payload))
    assert not client.announce(WeightsMessage(1, 0.0, payload))
    assert client.wait_for_newer(1, 0) == 2 and client.latest_version() == 2
    assert client.get_payload(client.latest().payload)["w"].tolist() == [1.0, 1.0]
    assert WeightStore.put in client.handle.methods


def test_hub_client_sends_and_drains():
    client = HubClient(RecordingHandle(TelemetryHub()))
    client.add_spans([{"name": "generate"}])
    client.add_metrics(3, {"loss": 0.5})
    client.add_event("rollouts", [{"uid": "u"}])
    drained = client.drain(timeout=1)
    assert drained == {
        "spans": [{"name": "generate"}],
        "metrics": [(3, {"loss": 0.5})],
        "events": [("rollouts", [{"uid": "u"}])],
    }
    assert client.drain()["spans"] == []
    assert client.handle.methods[-1] is TelemetryHub.drain


def test_no_module_calls_a_shared_object_by_method_name():
    """Method names live in the typed clients (as functions of the target class), nowhere as
    strings: ``handle.call("take", ...)`` would fail only at run time."""
    src = Path(__file__).resolve().parents[2] / "src" / "zbrl"
    offenders = [
        f"{path.relative_to(src)}:{n}"
        for path in sorted(src.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\.call\(\s*[\"']", line)
    ]
    assert offenders == []


def test_advance_version_errors_surface_at_the_next_call():
    class Failing(RolloutBuffer):
        def advance_version(self, version):
            raise RuntimeError(f"cannot advance to {version}")

    client = BufferClient(
        LocalHandle(Failing(buffer_settings(groups_per_step=1, max_staleness=0, num_producers=1)))
    )
    client.advance_version(1)  # does not raise here: nobody waits for it
    with pytest.raises(RuntimeError, match="cannot advance to 1"):
        client.take(1, 0)
    assert client.take(1, 0) == ("timeout", None)  # reported once


def test_hub_metrics_are_sent_without_waiting_and_errors_surface_next():
    class Full(TelemetryHub):
        def add_metrics(self, step, metrics):
            raise RuntimeError(f"hub refused step {step}")

    client = HubClient(LocalHandle(Full()))
    client.add_metrics(4, {"loss": 1.0})  # nobody waits for it here
    with pytest.raises(RuntimeError, match="hub refused step 4"):
        client.add_spans([{"name": "generate"}])  # a role's final flush waits for it
    client.add_spans([{"name": "push"}])  # reported once
    assert [s["name"] for s in client.drain()["spans"]] == ["push"]
