"""The peft adapter directories the vLLM backend writes for each LoRA version (no vLLM needed):
peft loads them back as the adapters that were sent, the tensors keep their names and dtype, and
what is not a LoRA adapter of the run's rank is refused by name."""

import json

import pytest
import torch
from safetensors.torch import load_file

from zbrl.config import load_config
from zbrl.rollout.backends.vllm.lora import (
    AdapterSpec,
    adapter_config,
    engine_args,
    engine_rank,
    write_adapter_dir,
)

A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def spec(rank=4, targets=("q_proj",), base="/base"):
    return AdapterSpec(
        rank=rank, alpha=8.0, target_modules=targets, base_model=base, use_rslora=False
    )


def test_peft_loads_the_written_directory_as_the_adapters_that_were_sent(tiny_model_dir, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from zbrl.models.lora import adapter_state, wrap

    lora = load_config(None, ["model.lora.rank=4", "model.lora.alpha=8"]).model.lora
    sent_model = wrap(AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in sent_model.named_parameters():
            if "lora_" in name:  # B starts at zero: give it (and A) values that change outputs
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    sent = {k: v.clone() for k, v in adapter_state(sent_model).items()}
    targets = tuple(lora.target_modules)
    path = write_adapter_dir(
        tmp_path / "v1", sent, spec(rank=4, targets=targets, base=str(tiny_model_dir))
    )

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    loaded = peft.PeftModel.from_pretrained(base, str(path)).eval()
    got = adapter_state(loaded)
    assert set(got) == set(sent) and len(sent) == 2 * 7 * 2  # A and B, 7 layers, 2 blocks
    for name, tensor in sent.items():
        assert torch.equal(got[name], tensor), name
    ids = torch.tensor([[1, 40, 41, 42, 12]])
    with torch.no_grad():
        want = sent_model.eval()(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits
        assert torch.allclose(loaded(input_ids=ids).logits, want, atol=1e-6)
    assert (want - plain).abs().max() > 1e-2  # the adapters do change the outputs


def test_tensors_keep_their_names_and_dtype_and_the_config_is_peft_s(tmp_path):
    sent = {A: torch.randn(4, 128, dtype=torch.bfloat16), B: torch.randn(128, 4).bfloat16()}
    path = write_adapter_dir(tmp_path / "v1", sent, spec())
    got = load_file(path / "adapter_model.safetensors")
    assert set(got) == {A, B}
    assert all(got[k].dtype == torch.bfloat16 and torch.equal(got[k], sent[k]) for k in sent)
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["target_modules"] == ["q_proj"] and config["base_model_name_or_path"] == "/base"


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"model.layers.0.self_attn.q_proj.weight": torch.zeros(128, 128)}, "adapters only"),
        ({A: torch.zeros(8, 128), B: torch.zeros(128, 8)}, r"not rank 4.*model\.lora\.rank"),
        ({A: torch.zeros(4, 128)}, "lacks lora_A or lora_B"),
        ({}, "no adapter tensors"),
    ],
)
def test_what_is_not_the_run_s_adapters_is_refused(tmp_path, tensors, message):
    with pytest.raises(ValueError, match=message):
        write_adapter_dir(tmp_path / "v1", tensors, spec())
    assert not (tmp_path / "v1").exists()


def test_the_engine_gets_the_smallest_rank_vllm_accepts():
    assert [engine_rank(r) for r in (1, 2, 8, 9, 16, 300, 512)] == [1, 8, 8, 16, 16, 320, 512]
    with pytest.raises(ValueError, match="above the largest vLLM serves"):
        engine_rank(513)
    assert engine_args(spec(rank=4)) == {
        "enable_lora": True,
        "max_lora_rank": 8,
        "max_loras": 1,
        "max_cpu_loras": 1,
    }


def test_spec_of_a_checkpoint_s_adapter_config():
    got = AdapterSpec.from_adapter_config(
        {"r": 16, "lora_alpha": 32, "target_modules": ["v_proj", "q_proj"], "use_rslora": True},
        "/b",
    )
    assert got == AdapterSpec(16, 32.0, ("v_proj", "q_proj"), "/b", True)
    regex = AdapterSpec.from_adapter_config({"r": 8, "lora_alpha": 8, "target_modules": ".*"}, "/b")
    assert regex.target_modules == ".*" and regex.use_rslora is False
    assert adapter_config(regex)["target_modules"] == ".*"  # peft reads a string as a regex
