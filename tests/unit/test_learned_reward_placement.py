"""Where learned rewards run (issue 30): a reward model or judge in a producer goes on the
producer's device in the inference dtype; reward workers are counted when a local Ray is sized.
CUDA is faked (no GPU here): the choice is what is tested, not the kernels."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch

from zbrl.config import load_config

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "demo.yaml"


class Recorder:
    """Stands in for a model loader or backend: records its device and dtype arguments."""

    calls: ClassVar[list[dict]] = []

    def __init__(self, *args, **kwargs):
        Recorder.calls.append(kwargs)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.fixture
def recorded(monkeypatch):
    Recorder.calls = []
    import zbrl.rewards.reward_model as reward_model

    monkeypatch.setattr(reward_model, "RewardModelScorer", Recorder)
    return Recorder.calls


def _cfg(tmp_path, *overrides):
    return load_config(None, [f"reward.path={tmp_path}", *overrides])


def test_a_reward_model_in_the_producer_follows_its_device_and_inference_dtype(
    tmp_path, fake_cuda, recorded
):
    from zbrl.assembly.rewards import reward_model_scorer

    cfg = _cfg(tmp_path, "reward.type=reward_model", "rollout.inference_dtype=bfloat16")
    reward_model_scorer(cfg)
    assert (recorded[-1]["device"], recorded[-1]["dtype"]) == ("cuda", torch.bfloat16)


def test_without_cuda_it_stays_on_the_cpu_in_the_inference_dtype(tmp_path, recorded):
    from zbrl.assembly.rewards import reward_model_scorer

    torch_available = torch.cuda.is_available()
    cfg = _cfg(tmp_path, "reward.type=reward_model")
    reward_model_scorer(cfg)
    expected = "cuda" if torch_available else "cpu"
    assert (recorded[-1]["device"], recorded[-1]["dtype"]) == (expected, getattr(
        torch, cfg.model.dtype))  # fmt: skip


def test_the_judge_runs_on_the_producers_device_in_the_inference_dtype(
    tiny_model_dir, fake_cuda, monkeypatch
):
    import zbrl.assembly.models as models
    from zbrl.assembly.rewards import build_reward_fn
    from zbrl.rollout.backends.transformers import backend

    loaded = []
    monkeypatch.setattr(models, "load_policy", lambda cfg, path, dtype: loaded.append(dtype))
    Recorder.calls = []
    monkeypatch.setattr(backend, "TransformersBackend", Recorder)
    cfg = load_config(
        None,
        [
            "reward.type=llm_judge",
            f"reward.path={tiny_model_dir}",
            "rollout.inference_dtype=float16",
        ],
    )
    build_reward_fn(cfg)
    assert loaded == [torch.float16]
    assert Recorder.calls[-1]["device"] == "cuda"


def test_the_scorer_loads_the_model_in_the_dtype_it_is_given(tmp_path_factory):
    from zbrl.embedded.reward_model import build_tiny_reward_model, save_reward_model
    from zbrl.embedded.tokenizer import build_tokenizer
    from zbrl.rewards.reward_model import RewardModelScorer

    tokenizer = build_tokenizer()
    model = build_tiny_reward_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=1)
    path = save_reward_model(model, tokenizer, tmp_path_factory.mktemp("rm") / "rm")
    scorer = RewardModelScorer(path, dtype=torch.bfloat16)
    assert next(scorer.model.parameters()).dtype == torch.bfloat16
    prompt = [{"role": "user", "content": "1+2?"}]
    [score] = scorer.score([prompt], ["3"])
    assert 0.0 < score < 1.0


def test_reward_workers_are_counted_when_a_local_ray_is_sized(tmp_path):
    from zbrl.launch.ray_setup import required_cpus

    base = required_cpus(load_config(DEMO, []))
    cfg = load_config(DEMO, ["reward.type=reward_model", f"reward.path={tmp_path}",
                             "reward.workers=2", "reward.worker_num_cpus=1.5"])  # fmt: skip
    assert required_cpus(cfg) == base + 3.0
