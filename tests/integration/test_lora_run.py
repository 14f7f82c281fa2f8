"""A LoRA run end to end (recipes/demo_lora.yaml, cut to a few tiny steps): only the adapters
are published (the summary's weight-sync size is theirs), the producers merge them, the
checkpoint is a peft adapter directory, and ``zbrl resume`` of a stopped run continues from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli_process import finish, start, tiny_run

pytest.importorskip("peft")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo_lora.yaml"
# rank 16 on 7 linear layers of 2 blocks of width 128 (MLP 512): 2 * (4 * 2 * 16 * 128 +
# 3 * 16 * (128 + 512)) adapter weights, float32 (the recipe's model.dtype) on the wire
ADAPTER_BYTES = 2 * (4 * 2 * 16 * 128 + 3 * 16 * (128 + 512)) * 4


def test_a_lora_run_sends_adapters_only_and_checkpoints_them(tmp_path, run_cache):
    run_dir = tmp_path / "run"
    args = [*tiny_run(run_dir, run_cache, 4, 1), "logging.save_interval=2"]
    code, err = finish(*start(tmp_path, "lora", "train", str(RECIPE), *args))
    assert code == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4
    assert summary["weight_sync_bytes_per_version"] == ADAPTER_BYTES == 376_832
    step = run_dir / "checkpoints" / "step-4"
    assert (step / "adapter_model.safetensors").is_file()
    assert not (step / "model.safetensors").exists()
    # a longer run resumed from the adapters: the same run directory, two more steps
    code, err = finish(*start(tmp_path, "resume", "resume", str(run_dir), "training.max_steps=6"))
    assert code == 0, err[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6
    assert (run_dir / "checkpoints" / "step-6" / "adapter_config.json").is_file()
