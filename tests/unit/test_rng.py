"""zbrl.rng: a process's generators saved and restored as one picklable value."""

import pickle
import random
import subprocess
import sys

import numpy as np
import torch

from zbrl.rng import rng_state, set_rng_state


def draws():
    return torch.rand(4).tolist(), random.random(), float(np.random.rand())


def test_a_restored_snapshot_draws_the_same_numbers_again():
    saved = pickle.loads(pickle.dumps(rng_state()))
    first = draws()
    set_rng_state(saved)
    assert draws() == first


def test_a_snapshot_unpickles_without_torch_and_older_tensor_snapshots_restore():
    """The snapshot travels with a producer's resume point through the rollout buffer's process,
    which does not import torch; a snapshot from an older checkpoint holds torch's state as a
    tensor and restores the same."""
    saved = rng_state()
    code = "import pickle, sys; pickle.load(sys.stdin.buffer); print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(saved), capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "False"
    first = draws()
    set_rng_state({**saved, "torch": torch.from_numpy(saved["torch"].copy())})
    assert draws() == first
