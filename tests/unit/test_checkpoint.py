"""Resumable checkpoints: atomic, verified, pruned; the newest complete one is picked and anything
incomplete (a crash mid-write, a file cut short, a corrupt byte) is skipped with a warning."""

from __future__ import annotations

import json

import pytest
import torch

from zbrl.training import checkpoint
from zbrl.training.checkpoint import (
    STATE_DIR,
    CheckpointError,
    IncompleteCheckpointWarning,
    check_complete,
    find_latest,
    load_state,
    prune,
    save_checkpoint,
)


class Weights:
    """A stand-in model that writes one weights file the way save_pretrained would."""

    rank = 0  # the writing rank (save_checkpoint writes on rank 0 only)

    def __init__(self, value: float) -> None:
        self.value = value

    def save_pretrained(self, directory) -> None:
        torch.save({"w": torch.full((64,), self.value)}, directory / "weights.pt")


def save(root, step, value=1.0):
    state = {"trainer.pt": {"version": step, "value": value}}
    return save_checkpoint(Weights(value), None, root / f"step-{step}", state=state)


def test_a_saved_checkpoint_is_complete_and_loads_back(tmp_path):
    path = save(tmp_path, 3, value=2.5)
    checkpoint = check_complete(path)
    assert checkpoint.version == 3
    assert load_state(checkpoint.trainer_file) == {"version": 3, "value": 2.5}
    assert set(checkpoint.meta["files"]) == {"weights.pt", f"{STATE_DIR}/trainer.pt"}
    assert [p.name for p in tmp_path.iterdir()] == ["step-3"]  # no temporary left


def test_the_newest_complete_checkpoint_is_picked_and_broken_ones_skipped(tmp_path):
    save(tmp_path, 2)
    save(tmp_path, 10)
    cut = save(tmp_path, 12)
    data = (cut / "weights.pt").read_bytes()
    (cut / "weights.pt").write_bytes(data[: len(data) // 2])  # cut in half
    flipped = save(tmp_path, 14)
    raw = bytearray((flipped / STATE_DIR / "trainer.pt").read_bytes())
    raw[-5] ^= 0xFF  # same size, one byte wrong
    (flipped / STATE_DIR / "trainer.pt").write_bytes(bytes(raw))
    unfinished = save(tmp_path, 16)
    unfinished.rename(tmp_path / "step-16.tmp-999")  # what a crash mid-write leaves
    no_meta = save(tmp_path, 18)
    (no_meta / STATE_DIR / "meta.json").unlink()
    with pytest.warns(IncompleteCheckpointWarning) as caught:
        latest = find_latest(tmp_path)
    assert latest is not None and latest.version == 10
    messages = "\n".join(str(w.message) for w in caught)
    assert "step-12 is incomplete: weights.pt has" in messages
    assert "step-14 is incomplete: zbrl/trainer.pt does not match the SHA-256" in messages
    assert "step-16.tmp-999: a checkpoint that was never finished" in messages
    assert "step-18 is incomplete" in messages and "meta.json is missing" in messages


def test_no_checkpoint_is_none(tmp_path):
    assert find_latest(tmp_path / "missing") is None
    assert find_latest(tmp_path) is None


def test_saving_over_an_existing_step_replaces_it_whole(tmp_path):
    save(tmp_path, 5, value=1.0)
    save(tmp_path, 5, value=7.0)
    assert load_state(check_complete(tmp_path / "step-5").trainer_file)["value"] == 7.0
    assert [p.name for p in tmp_path.iterdir()] == ["step-5"]


def test_prune_keeps_the_newest(tmp_path):
    for step in (1, 2, 10, 11):
        save(tmp_path, step)
    deleted = prune(tmp_path, keep=2)
    assert sorted(p.name for p in deleted) == ["step-1", "step-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10", "step-11"]
    assert prune(tmp_path, keep=0) == []


def test_prune_reads_no_file_back(tmp_path, monkeypatch):
    """prune runs after every save: it checks the manifest and sizes, never the hashes."""
    for step in (1, 2, 3):
        save(tmp_path, step)
    truncated = save(tmp_path, 4)
    (truncated / STATE_DIR / "trainer.pt").write_bytes(b"cut")  # a cut file: not complete
    monkeypatch.setattr(checkpoint, "_sha256", lambda path: pytest.fail(f"hashed {path}"))
    assert sorted(p.name for p in prune(tmp_path, keep=2)) == ["step-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-3", "step-4"]


def test_a_corrupt_state_file_is_named(tmp_path):
    bad = tmp_path / "trainer.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint file {bad}"):
        load_state(bad)


def test_meta_records_the_version(tmp_path):
    path = save(tmp_path, 4)
    meta = json.loads((path / STATE_DIR / "meta.json").read_text())
    assert meta["version"] == 4 and meta["format"] == 1
