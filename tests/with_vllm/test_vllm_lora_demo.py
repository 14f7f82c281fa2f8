"""The LoRA demo (recipes/demo_lora.yaml) with rollout.backend.type=vllm: the consumer trains peft
adapters on the frozen base, only they are published, and the producer and the evaluator serve
them through vLLM's LoRA support. Held-out accuracy must rise by at least 10 points in 150 steps,
the weight sync must carry the adapters' bytes only, and vLLM's log-probs must match the
trainer's (the adapters as vLLM computes them are the adapters as peft trains them). Run
on-policy (max_staleness 0) so that every step's tokens come from the version the trainer holds
and that match is measured at every step, not only at the first (the base's). About 3.5 minutes
on 2 shared cores."""

import json
from pathlib import Path

import pytest

from zbrl.config import load_config
from zbrl.launch.driver import run_training

pytest.importorskip("peft")
pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo_lora.yaml"
# rank 16 on 7 linear layers of 2 blocks of width 128 (MLP 512), float32 (as in
# tests/integration/test_lora_run.py)
ADAPTER_BYTES = 2 * (4 * 2 * 16 * 128 + 3 * 16 * (128 + 512)) * 4


def test_lora_demo_with_vllm_learns_and_sends_adapters_only(tmp_path):
    overrides = [
        "rollout.backend.type=vllm",
        f"logging.run_dir={tmp_path / 'run'}",
        f"logging.cache_dir={tmp_path / 'cache'}",
        "logging.progress=false",
        "training.max_steps=150",
        "eval.interval=150",
        "transport.max_staleness=0",
    ]
    summary = run_training(load_config(RECIPE, overrides))
    assert summary["steps"] == 150
    assert summary["weight_sync_bytes_per_version"] == ADAPTER_BYTES == 376_832
    gain = summary["eval_accuracy_final"] - summary["eval_accuracy_initial"]
    assert gain >= 0.10, summary
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "mismatch_abs_logp" in m]
    assert len(steps) == 150
    # every step trains tokens its own version sampled: vLLM (base + served adapters) and the
    # trainer (peft) differ by the kernels alone
    assert all(m["drift_token_frac"] < 1 for m in steps)
    assert max(m["mismatch_abs_logp"] for m in steps) < 0.01
    checkpoint = tmp_path / "run" / "checkpoints" / "step-150"
    assert (checkpoint / "adapter_model.safetensors").is_file()


def test_a_lora_run_on_vllm_resumes_from_its_adapters(tmp_path, run_cache):
    """``zbrl resume`` of a LoRA run on vLLM: the producer's engine starts on the base the
    checkpoint names and serves the checkpoint's adapters, then the run goes on (merged mode,
    which takes the same path through build_vllm_backend)."""
    from helpers.cli_process import finish, start, tiny_run

    run_dir = tmp_path / "run"
    args = [
        *tiny_run(run_dir, run_cache, 3, 1),
        "logging.save_interval=3",
        "rollout.backend={type: vllm, lora_mode: merged}",
    ]
    code, err = finish(*start(tmp_path, "lora", "train", str(RECIPE), *args))
    assert code == 0, err[-3000:]
    code, err = finish(*start(tmp_path, "resume", "resume", str(run_dir), "training.max_steps=5"))
    assert code == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["weight_sync_bytes_per_version"] == ADAPTER_BYTES
    assert (run_dir / "checkpoints" / "step-5" / "adapter_config.json").is_file()
