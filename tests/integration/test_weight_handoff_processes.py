"""The cross-process harness of the CUDA handoff's GPU tests (tests/gpu/test_cuda_ipc.py) on CPU:
a publisher here and a spawned ``CudaIpcReceiver`` over a manager-served WeightStore. Without a GPU
the route is the object store (the weights are not on a CUDA device); every loaded version still
equals the published one bit for bit."""

from __future__ import annotations

import pytest

from helpers.handoff import check_loaded, hand_off

pytestmark = pytest.mark.slow


def test_two_processes_on_cpu_take_the_object_store_route():
    loaded, done, pub = hand_off("cpu", versions=3, load_delay_s=0.0)
    assert done[1] == "object_store"
    assert "not on a CUDA device" in done[2]
    assert check_loaded(loaded, last=3)[-1] == 3
    assert pub.buffer_sets == 0
