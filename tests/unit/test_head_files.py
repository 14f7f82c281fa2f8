"""Files written on the driver's node for workers elsewhere (zbrl.launch.head_files) and the
shipping of directories to other nodes (zbrl.launch.shipping), without Ray: the actor's class is
called directly, as Ray would call it in its process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zbrl.launch.head_files import HeadFiles
from zbrl.launch.shipping import ShippedDir, Shipper, fingerprint, local_path
from zbrl.training.checkpoint import CheckpointError, find_latest, save_checkpoint


class FileWriter:
    """Writes a stand-in for a model's weights (a PretrainedWriter of rank 0)."""

    rank = 0

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def save_pretrained(self, directory: Path) -> None:
        (directory / "model.safetensors").write_bytes(self.payload)


def stream(head: HeadFiles, source: Path, rel_tmp: str, chunk: int = 7) -> None:
    """Send every file of ``source`` as HeadMirror does, in chunks of ``chunk`` bytes."""
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = f"{rel_tmp}/{file.relative_to(source)}"
        head.begin(rel)
        data = file.read_bytes()
        for start in range(0, len(data), chunk):
            head.append(rel, data[start : start + chunk])


def test_a_streamed_checkpoint_is_published_whole_and_pruned(tmp_path):
    node, run = tmp_path / "node", tmp_path / "head-run"
    run.mkdir()
    head = HeadFiles(str(run))
    for step in (2, 4):
        saved = save_checkpoint(
            FileWriter(bytes(range(50)) * step), None, node / "checkpoints" / f"step-{step}",
            state={"trainer.pt": {"step": step}},
        )  # fmt: skip
        stream(head, saved, f"checkpoints/step-{step}.tmp-head")
        published = head.publish_checkpoint(
            f"checkpoints/step-{step}.tmp-head", f"checkpoints/step-{step}", keep=1
        )
        assert published == str(run / "checkpoints" / f"step-{step}")
    latest = find_latest(run / "checkpoints")
    assert latest is not None and latest.version == 4
    assert (latest.path / "model.safetensors").read_bytes() == bytes(range(50)) * 4
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-4"]  # keep=1


def test_a_checkpoint_cut_short_on_the_way_is_not_published(tmp_path):
    node, run = tmp_path / "node", tmp_path / "head-run"
    run.mkdir()
    head = HeadFiles(str(run))
    saved = save_checkpoint(FileWriter(b"x" * 100), None, node / "checkpoints" / "step-1")
    stream(head, saved, "checkpoints/step-1.tmp-head")
    head.replace("checkpoints/step-1.tmp-head/model.safetensors", b"x" * 99)
    with pytest.raises(CheckpointError, match=r"model\.safetensors has 99 bytes, 100 were written"):
        head.publish_checkpoint("checkpoints/step-1.tmp-head", "checkpoints/step-1", keep=0)
    assert list((run / "checkpoints").iterdir()) == []  # nothing half-copied is left


def test_head_files_stay_inside_the_run_directory(tmp_path):
    head = HeadFiles(str(tmp_path / "run"))
    with pytest.raises(ValueError, match="not inside the run directory"):
        head.replace("../elsewhere.txt", b"no")
    head.append("eval/uids.jsonl", b"a\n")
    head.append("eval/uids.jsonl", b"b\n")
    assert (tmp_path / "run" / "eval" / "uids.jsonl").read_text() == "a\nb\n"


def test_fingerprint_follows_names_sizes_and_changes(tmp_path):
    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "sub" / "w.bin").write_bytes(b"1234")
    first = fingerprint(d)
    assert fingerprint(d) == first
    os.utime(d / "sub" / "w.bin", ns=(1, 1))  # rewritten: another modification time
    assert fingerprint(d) != first


def test_one_node_ships_nothing_and_paths_map_into_a_copy(tmp_path):
    shipped = Shipper("node-a", multi_node=False).ship(Path("relative") / "model")
    assert shipped == ShippedDir(str(Path.cwd() / "relative" / "model"), "node-a")
    assert not shipped.shipped  # workers read the driver's (absolute) path
    inside = f"{shipped.path}/zbrl/trainer.pt"
    assert local_path(shipped, tmp_path / "copy", inside) == tmp_path / "copy/zbrl/trainer.pt"
