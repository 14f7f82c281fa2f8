"""LoRA on two DDP ranks (spawned, gloo on 127.0.0.1) trains exactly like one process: the same
adapter gradients and adapter weights after the step, the frozen base without gradients (in
the slow tier)."""

from __future__ import annotations

import pytest
import torch

from helpers.data_parallel import Case, run_case, run_distributed

pytest.importorskip("peft")
# two spawned ranks cost ~15 s idle, ~50 s at load 10: the slow tier (make test-slow)
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

LORA = Case(
    "lora",
    (
        "model.lora.rank=4",
        "model.lora.alpha=8",
        "training.train_microbatch_size=2",
        "algorithm.lr=1e-3",
    ),
    3,
    seed=5,
)


def test_lora_on_two_ddp_ranks_matches_one_process(tiny_model_dir, tmp_path):
    got = run_distributed("ddp", [LORA], tiny_model_dir, tmp_path / "results.pt")["lora"]
    want = run_case(LORA, "single", 1, tiny_model_dir)
    assert len(got["grads"]) == len(want["grads"]) >= 1
    for got_step, want_step in zip(got["grads"], want["grads"], strict=True):
        trained = {n for n, g in want_step.items() if g is not None}
        assert trained and all(".lora_" in n for n in trained)
        assert {n for n, g in got_step.items() if g is not None} == trained
        for name in trained:
            torch.testing.assert_close(got_step[name], want_step[name], atol=1e-6, rtol=0)
    assert got["weights"].keys() == want["weights"].keys()
    assert all(".lora_" in n for n in got["weights"])
    # AdamW moves each element by lr * m / (sqrt(v) + eps): an element whose gradient is near
    # eps (1e-8) turns the ranks' summation-order differences (the gradients above agree to
    # ~2e-8) into weight differences of up to a small fraction of lr (1e-3): measured 1.06e-6
    # with peft 0.21.2. A wrong normaliser shows in the gradients, checked at 1e-6 above; here
    # 1e-5 (1% of lr) still catches an adapter stepped differently or not at all
    for name, tensor in want["weights"].items():
        torch.testing.assert_close(got["weights"][name], tensor, atol=1e-5, rtol=0, msg=name)
