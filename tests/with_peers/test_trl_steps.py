"""bench/peers_trl.py's TRL side for real: a few GRPOTrainer steps on the embedded tiny model with
zbrl's prompts and reward, weight snapshots outside the clock, scored by zbrl's evaluator."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from zbrl.config import load_config

pytestmark = pytest.mark.peers

REPO = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("peers_trl", REPO / "bench" / "peers_trl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trl_steps_on_the_tiny_model(tiny_model_dir, task_files, tmp_path) -> None:
    bench = _bench()
    train, held_out = task_files
    cfg = load_config(
        str(REPO / "recipes" / "demo.yaml"),
        [
            f"model.path={tiny_model_dir}",
            f"data.train_path={train}",
            f"eval.sets={{heldout: {held_out}}}",
            "eval.temperature=0",
            f"logging.cache_dir={tmp_path / 'cache'}",
            "training.max_steps=2",
        ],
    )
    shared = bench.Shared(cfg, cores=1)
    calls = []
    score = shared.reward_fn.score_batch
    shared.reward_fn.score_batch = lambda *a, **k: calls.append(len(a[0])) or score(*a, **k)
    args = argparse.Namespace(steps=2, eval_every=1, cores=1)
    run = bench.run_trl(shared, args, tmp_path / "trl")

    assert run["steps"] == 2
    assert calls == [64, 64]  # 8 prompts x 8 completions scored per step by zbrl's reward
    steps = [step for step, _, _ in run["snapshots"]]
    seconds = [s for _, s, _ in run["snapshots"]]
    assert steps == [1, 2] and 0 < seconds[0] < seconds[1]
    # 64 completions of 1..32 tokens per step; training tokens add the prompts
    assert 2 * 64 <= run["generation_tokens"] <= 2 * 64 * 32
    assert run["train_tokens"] > run["generation_tokens"]
    assert run["generate_s"] > 0 and run["train_s"] > 0
    assert any(note.startswith("threads") for note in run["unmatched"])

    curve = bench.trl_curve(shared, run, initial=0.0)
    assert [p.step for p in curve] == [0, 1, 2]
    assert all(0.0 <= p.accuracy <= 1.0 for p in curve)
