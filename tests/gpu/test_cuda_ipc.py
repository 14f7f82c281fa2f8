"""The CUDA weight handoff across two processes on one GPU (``transport.weight_sync.type=
cuda_ipc``): this process publishes float32 master weights on ``cuda:0`` cast to bfloat16; a
spawned process (:func:`helpers.handoff.receive_versions`, a ``CudaIpcReceiver`` named
``producer-0``) maps the shared buffers, loads every version it takes into its own bfloat16
tensors and sends their bytes back. Checked: the route is CUDA IPC, every loaded version equals the
published one bit for bit (no torn version while the publisher writes the next into the other
buffer set), versions only go up, the last one arrives, and two buffer sets suffice.

Skipped without CUDA (tests/integration/test_weight_handoff_processes.py runs the same two
processes on CPU, where the route is the object store). On the GPU machine:
``bash bench/gpu_handoff.sh``."""

from __future__ import annotations

import pytest

from helpers.handoff import check_loaded, hand_off

pytestmark = pytest.mark.gpu


def test_same_gpu_handoff_is_bit_exact_over_cuda_ipc():
    loaded, done, pub = hand_off("cuda:0", versions=1, load_delay_s=0.0)
    assert done[1] == "cuda_ipc", done[2]
    assert check_loaded(loaded, last=1) == [1]
    assert pub.peak_buffer_sets == 1


def test_version_sequence_double_buffered_never_torn():
    # the receiver loads slowly while eight versions go out as fast as the publisher can write:
    # it skips some, never reads a buffer set being rewritten, and gets the last one
    loaded, done, pub = hand_off("cuda:0", versions=8, load_delay_s=0.2)
    assert done[1] == "cuda_ipc", done[2]
    versions = check_loaded(loaded, last=8)
    assert pub.peak_buffer_sets == 2
    print(f"loaded versions {versions}; publish waited {pub.waited_s:.3f} s for a free set")
