"""FSDP2 with CPU offload (``training.engine.cpu_offload``) trains exactly like FSDP2 without it:
2 spawned gloo ranks, the same batch (gradient accumulation over uneven micro-batches, the KL
reference), the same gradients, metrics and updated weights, in float32 and with bfloat16
compute; the offload policy is really applied to every sharded module and the optimizer state
lives on the CPU; the gathered weights (what is published and checkpointed) and a saved
checkpoint come out of the offloaded engine. On a CPU machine offload moves nothing, so equality
is exact up to float32 summation order."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers.data_parallel import Case, run_distributed

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # one FSDP2 pair: ~20 s

STEP = ("training.train_microbatch_size=2", "algorithm.lr=1e-4", "algorithm.beta=0.1")
OFFLOAD = "training.engine.cpu_offload=true"
BF16 = "model.dtype=bfloat16"  # FSDP2's mixed-precision policy with offload


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("offload")
    cases = [
        Case("plain", STEP, 3, seed=5),
        Case("offload", (*STEP, OFFLOAD), 3, seed=5),
        Case("plain-bf16", (*STEP, BF16), 3, seed=5),
        Case("offload-bf16", (*STEP, BF16, OFFLOAD), 3, seed=5),
        Case(
            "offload-resume",
            (*STEP, OFFLOAD),
            3,
            seed=6,
            extra={"checkpoint_dir": str(out / "ckpt" / "step-1")},
        ),
    ]
    return run_distributed("fsdp2", cases, tiny_model_dir, out / "results.pt"), out


def _assert_dicts_close(got, want, atol, what):
    assert set(got) == set(want), what
    for name, ref in want.items():
        torch.testing.assert_close(got[name], ref, atol=atol, rtol=0, msg=f"{what}: {name}")


@pytest.mark.parametrize("precision", ["", "-bf16"], ids=["float32", "bfloat16"])
def test_offloaded_step_equals_the_plain_step(results, tiny_model_dir, precision):
    got, want = results[0][f"offload{precision}"], results[0][f"plain{precision}"]
    assert len(got["grads"]) == len(want["grads"]) == 1  # one optimizer step
    for g, w in zip(got["grads"], want["grads"], strict=True):
        _assert_dicts_close(g, w, 1e-6, "offloaded gradient")
    _assert_dicts_close(got["weights"], want["weights"], 1e-6, "offloaded weights")
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    moved = max((got["weights"][k] - v).abs().max() for k, v in initial.items())
    assert moved > 1e-5  # the step changed the weights by more than the tolerance
    for key in ("loss", "trained_tokens", "num_tokens", "pg_loss", "entropy", "kl"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], abs=1e-6), key


def test_offload_policy_is_applied_and_optimizer_state_is_on_cpu(results):
    got, want = results[0]["offload"]["placement"], results[0]["plain"]["placement"]
    assert got["offload_policies"] == ["CPUOffloadPolicy"]  # every sharded module
    assert want["offload_policies"] == ["OffloadPolicy"]  # the default: no offload
    assert got["param_devices"] == ["cpu"]
    assert got["optimizer_state_tensors"] > 0  # AdamW's moments exist (a step was taken)
    assert got["optimizer_state_devices"] == ["cpu"]


def test_offloaded_engine_publishes_checkpoints_and_resumes(results):
    got, out = results[0]["offload-resume"], results[1]
    assert got["checkpoint_entries"] == ["step-1"]
    loaded = AutoModelForCausalLM.from_pretrained(out / "ckpt" / "step-1").state_dict()
    _assert_dicts_close({k: loaded[k] for k in got["saved_weights"]}, got["saved_weights"], 0, "")
    assert got["steps"] == (2, 2)
    _assert_dicts_close(got["resumed"], got["continued"], 1e-6, "offloaded resume")
