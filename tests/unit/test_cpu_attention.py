"""Attention in float32 under CPU bfloat16 autocast (zbrl/models/cpu_attention.py): which models
are switched, that the output is float32 SDPA's, and that packed rows still get their mask. A
bfloat16 step's loss and gradients against float32's: test_mixed_precision.py, on this path."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from zbrl.assembly.models import build_engine
from zbrl.config import load_config
from zbrl.models.cpu_attention import SDPA_FLOAT32, attention_in_float32, sdpa_in_float32
from zbrl.training.model_inputs import packed_attention_mask


def config(*overrides: str):
    return load_config(None, ["training.device=cpu", "training.train_batch_size=4", *overrides])


def implementation(model) -> str:
    return model.config._attn_implementation


def test_a_bf16_cpu_engine_runs_its_policy_and_reference_on_float32_attention(tiny_model_dir):
    bf16 = build_engine(
        config("model.dtype=bfloat16", "algorithm.beta=0.1"), tiny_model_dir, total_steps=2
    )
    assert implementation(bf16.policy) == SDPA_FLOAT32
    assert implementation(bf16.reference) == SDPA_FLOAT32
    fp32 = build_engine(config(), tiny_model_dir, total_steps=2)
    assert implementation(fp32.policy) == "sdpa"


@pytest.mark.parametrize(
    ("device", "dtype", "attn", "switched"),
    [
        ("cpu", torch.bfloat16, "sdpa", True),
        ("cpu", torch.float32, "sdpa", False),
        ("cuda", torch.bfloat16, "sdpa", False),  # GPU bfloat16 attention is fast: left alone
        ("cpu", torch.bfloat16, "eager", False),
    ],
)
def test_only_sdpa_under_cpu_bf16_is_switched(tiny_model_dir, device, dtype, attn, switched):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn)
    assert attention_in_float32(model, torch.device(device), dtype) is switched
    assert implementation(model) == (SDPA_FLOAT32 if switched else attn)


def test_the_output_is_float32_sdpa_of_the_inputs_cast_back(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    module = model.model.layers[0].self_attn
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 32, dtype=torch.bfloat16) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = sdpa_in_float32(module, q, k, v, None, scaling=module.scaling)
    want, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), None,
                                     scaling=module.scaling)  # fmt: skip
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, want.to(torch.bfloat16), rtol=0, atol=0)


def test_packed_rows_take_the_boolean_mask_under_it(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    attention_in_float32(model, torch.device("cpu"), torch.bfloat16)
    allowed = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()
    assert packed_attention_mask(model, allowed) is allowed


@pytest.mark.parametrize(
    ("dtype", "device", "flags", "warned"),
    [
        ("bfloat16", "cpu", {"avx2", "avx512f"}, True),
        ("bfloat16", "cpu", {"avx512f", "avx512_bf16"}, False),
        ("bfloat16", "cpu", {"amx_bf16", "amx_tile"}, False),
        ("float32", "cpu", {"avx2"}, False),
        ("bfloat16", "cuda", {"avx2"}, False),
    ],
)
def test_bf16_on_a_cpu_without_bf16_instructions_is_named_with_the_fix(
    dtype, device, flags, warned
):
    from zbrl.launch.cpu_features import slow_bf16_notice

    cfg = config(f"model.dtype={dtype}", f"training.device={device}")
    notice = slow_bf16_notice(cfg, frozenset(flags))
    if warned:
        assert "without AVX512-BF16 or AMX" in notice and "set model.dtype=float32" in notice
    else:
        assert notice is None


def test_the_cpu_flags_are_read_from_cpuinfo_and_a_missing_file_gives_none(tmp_path):
    from zbrl.launch.cpu_features import cpu_flags, trains_on_cpu

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") is None
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    assert trains_on_cpu(config(), gpus)  # training.device=cpu in config()
    auto = load_config(None, ["training.device=auto"])
    assert trains_on_cpu(auto, gpus) and trains_on_cpu(auto, tmp_path / "none")
    (gpus / "0000:01:00.0").mkdir()
    assert not trains_on_cpu(auto, gpus)
