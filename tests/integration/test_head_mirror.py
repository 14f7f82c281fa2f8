"""Shipping a directory to a node and copying a worker's files back to the head, through a local
Ray: the worker's side runs in this process as if on another node (the driver's node id is one
that is not this one), the head's side is the HeadFiles actor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

import zbrl.launch.head_files as head_files
import zbrl.launch.shipping as shipping
from zbrl.launch.head_files import HeadFiles, HeadMirror, node_run_dir
from zbrl.launch.shipping import Shipper, local_dir
from zbrl.training.checkpoint import find_latest, save_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

ELSEWHERE = "f" * 56
"""A node id that is not this process's node: the driver's node, seen from 'another node'."""


class FileWriter:
    rank = 0

    def save_pretrained(self, directory: Path) -> None:
        (directory / "model.safetensors").write_bytes(bytes(range(256)) * 3)


def test_a_directory_is_shipped_once_per_node_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(shipping, "CHUNK_BYTES", 100)
    model = tmp_path / "driver" / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"a": 1}')
    (model / "sub" / "weights.bin").write_bytes(bytes(range(256)))
    (model / "empty.txt").write_bytes(b"")
    shipped = Shipper(ELSEWHERE, multi_node=True).ship(model)
    assert [len(refs) for refs in shipped.chunks.values()] == [1, 1, 3]  # sorted names
    cache = tmp_path / "node-cache"
    copy = local_dir(shipped, cache)
    assert copy == cache / "shipped" / shipped.fingerprint
    for rel in ("config.json", "sub/weights.bin", "empty.txt"):
        assert (copy / rel).read_bytes() == (model / rel).read_bytes()
    (copy / "config.json").write_text("found, not rewritten")
    assert local_dir(shipped, cache) == copy  # the node's copy is reused
    assert (copy / "config.json").read_text() == "found, not rewritten"
    here = Shipper(ray.get_runtime_context().get_node_id(), multi_node=True).ship(model)
    assert local_dir(here, cache) == model  # on the driver's node: the driver's path


def test_a_workers_files_reach_the_heads_run_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(head_files, "CHUNK_BYTES", 100)
    head_run = tmp_path / "head" / "run"
    head_run.mkdir(parents=True)
    local_run = node_run_dir(str(head_run), ELSEWHERE, tmp_path / "node-cache")
    assert local_run.parent == tmp_path / "node-cache" / "node-runs"
    assert local_run.name.startswith("run-")
    head = ray.remote(HeadFiles).remote(str(head_run))
    mirror = HeadMirror(head, local_run)
    try:
        for step in (2, 4):
            path = local_run / "checkpoints" / f"step-{step}"
            saved = save_checkpoint(FileWriter(), None, path, state={"trainer.pt": {"s": step}})
            mirror.checkpoint_saved(saved, keep=1)
        uid_log = local_run / "trained_uids.jsonl"
        for step in (1, 2):
            mirror.line_appended(uid_log, json.dumps({"step": step}) + "\n")
        (local_run / "eval").mkdir()
        (local_run / "eval" / "4.jsonl").write_text('{"step": 4}\n')
        mirror.file_written(local_run / "eval" / "4.jsonl")
    finally:
        ray.kill(head)
    latest = find_latest(head_run / "checkpoints")
    assert latest is not None and latest.version == 4
    assert sorted(p.name for p in (head_run / "checkpoints").iterdir()) == ["step-4"]
    local = local_run / "checkpoints" / "step-4" / "model.safetensors"
    assert (latest.path / "model.safetensors").read_bytes() == local.read_bytes()
    lines = (head_run / "trained_uids.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert (head_run / "eval" / "4.jsonl").read_text() == '{"step": 4}\n'
