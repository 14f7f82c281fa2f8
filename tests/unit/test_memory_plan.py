"""The memory plan (docs/memory.md): parameter counts against real models, the consumer's bytes
against a hand count, the command's table, JSON and exit status, and the pre-flight refusal."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from zbrl.cli import main
from zbrl.config import load_config
from zbrl.errors import RunError
from zbrl.planning.memory import GIB, activation_bytes, layer_activation_bytes, plan_memory
from zbrl.planning.model_shape import (
    KNOWN_SHAPES,
    ShapeUnknown,
    known_shape,
    model_shape,
    read_shape,
    shape_from_config,
)

ROOT = Path(__file__).resolve().parents[2]
DAPO_7B = str(ROOT / "recipes" / "dapo_qwen2.5_7b_gpu.yaml")
QWEN_7B = KNOWN_SHAPES["Qwen/Qwen2.5-7B"]


@pytest.mark.parametrize(
    "kind, extra",
    [
        ("llama", {"tie_word_embeddings": True}),
        ("qwen2", {"tie_word_embeddings": False}),
        ("qwen3", {"tie_word_embeddings": True, "head_dim": 12}),
    ],
)
def test_the_parameter_count_from_the_shape_is_the_models_own(kind, extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        kind,
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        **extra,
    )
    model = AutoModelForCausalLM.from_config(config)
    shape = shape_from_config(config.to_dict(), "test")
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_known_shapes_give_the_published_parameter_counts():
    # the model cards' figures: 0.49B, 1.54B, 7.61B, 0.6B
    counts = {k: round(s.params / 1e9, 2) for k, s in KNOWN_SHAPES.items()}
    assert counts == {
        "Qwen/Qwen2.5-0.5B": 0.49,
        "Qwen/Qwen2.5-1.5B": 1.54,
        "Qwen/Qwen2.5-7B": 7.62,
        "Qwen/Qwen3-0.6B": 0.6,
    }
    assert known_shape("/models/Qwen2.5-7B-Instruct").params == QWEN_7B.params
    assert "table of known shapes" in known_shape("Qwen/Qwen2.5-7B").source
    with pytest.raises(ShapeUnknown, match=r"model\.path='org/unknown-model' is not on this"):
        read_shape("org/unknown-model", "/nonexistent", field="model.path")


def test_the_embedded_shape_is_the_embedded_models(tiny_model_dir):
    shape = model_shape(load_config(None))
    assert shape.params == 538_624  # docs/precision.md's count of the demo's weights
    local = read_shape(str(tiny_model_dir), "/nonexistent", field="model.path")
    assert replace(local, source="") == replace(shape, source="")
    assert local.source == str(tiny_model_dir / "config.json")


def test_the_single_engine_consumer_is_the_hand_count():
    cfg = load_config(DAPO_7B, ["training.engine=single", "launch.num_consumers=1"])
    consumer = plan_memory(cfg, QWEN_7B, 80 * GIB).worker("consumer")
    p = QWEN_7B.params
    assert consumer.device["master weights"] == 4 * p
    assert consumer.device["gradients"] == 4 * p
    assert consumer.device["optimizer"] == 8 * p
    # autocast's bfloat16 copy of every weight a linear layer uses (the input embedding is not)
    assert consumer.device["compute copy"] == 2 * (p - 152064 * 3584)
    assert "reference" not in consumer.device  # DAPO: beta = 0
    hand = 16 * p + 2 * p
    before = sum(consumer.device[k] for k in ("master weights", "gradients", "optimizer"))
    before += consumer.device["compute copy"]
    assert abs(before - hand) / hand < 0.10


def test_fsdp2_shards_offload_moves_to_host_and_context_parallel_splits_tokens():
    base = ["training.engine=fsdp2", "launch.num_consumers=4", "launch.consumer_num_gpus=1"]
    sharded = plan_memory(load_config(DAPO_7B, base), QWEN_7B, 80 * GIB).worker("consumer")
    assert sharded.device["optimizer"] == 8 * QWEN_7B.params // 4
    offload = load_config(DAPO_7B, [*base, "training.engine.cpu_offload=true"])
    moved = plan_memory(offload, QWEN_7B, 80 * GIB).worker("consumer")
    assert "optimizer" not in moved.device and moved.host["optimizer"] == 8 * QWEN_7B.params // 4
    cp = plan_memory(
        load_config(DAPO_7B, [*base, "training.engine.context_parallel_size=2"]), QWEN_7B, 80 * GIB
    )
    full = plan_memory(load_config(DAPO_7B, base), QWEN_7B, 80 * GIB)
    assert cp.tokens_per_microbatch * 2 == full.tokens_per_microbatch == 2 * (512 + 3584)


def test_gradient_checkpointing_keeps_one_layer_and_the_layer_inputs():
    s, t = QWEN_7B, 1000
    a = layer_activation_bytes(s, 2, 4, autocast=True)
    # per token: 2 norms x 8h, q/k/v inputs cast 3 times, q/k/v, attention out + o_proj input,
    # gate/up inputs cast twice, 4 MLP intermediates
    h, q, k, i = 3584, 28 * 128, 4 * 128, 18944
    assert a == 16 * h + 6 * h + 2 * (q + 2 * k) + 4 * q + 4 * h + 8 * i
    full = activation_bytes(s, t, 2, 4, autocast=True, checkpointing=False)
    ckpt = activation_bytes(s, t, 2, 4, autocast=True, checkpointing=True)
    assert full - ckpt == t * ((s.layers - 1) * a - s.layers * 4 * h)


def test_the_7b_recipe_fits_its_gpus_and_prints_the_table(capsys):
    assert main(["plan", "--memory", DAPO_7B, "--gpu-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert "table of known shapes (Qwen/Qwen2.5-7B)" in out
    assert "verdict: fits 4 GPU(s) of 80 GiB" in out
    for part in ("master weights", "gradients", "optimizer", "compute copy", "activations"):
        assert part in out


def test_json_gives_fits_and_bytes_by_part(capsys):
    assert main(["plan", "--memory", DAPO_7B, "--gpu-gb", "80", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is True
    consumer = out["workers"]["consumer"]
    assert consumer["device"]["optimizer"] == 8 * QWEN_7B.params // 2
    assert consumer["total"] == sum(consumer["device"].values())
    assert set(out["workers"]) == {"producer", "consumer"}
    assert out["workers"]["producer"]["device"]["weights"] == 2 * QWEN_7B.params


def test_a_plan_that_does_not_fit_exits_1_naming_the_fixes_that_fit(capsys):
    assert main(["plan", "--memory", DAPO_7B, "--gpu-gb", "24"]) == 1
    out = capsys.readouterr().out
    assert "verdict: does not fit" in out
    assert "training.engine={type: fsdp2, cpu_offload: true}" in out
    assert "launch.num_consumers=16" in out  # the fewest FSDP2 ranks whose shards fit
    assert main(["plan", "--memory", DAPO_7B, "--gpu-gb", "24", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False
    fixes = [" ".join(f["overrides"]) for f in out["fixes"]]
    assert any("cpu_offload: true" in f for f in fixes)
    # each named fix fits when applied
    for fix in out["fixes"]:
        assert main(["plan", "--memory", DAPO_7B, *fix["overrides"], "--gpu-gb", "24"]) == 0
        capsys.readouterr()


def test_a_layout_over_the_given_gpus_does_not_fit(capsys):
    assert main(["plan", "--memory", DAPO_7B, "--gpu-gb", "80", "--gpus", "3"]) == 1
    assert "the layout needs 4 GPUs, 3 given" in capsys.readouterr().out


def test_a_gpu_run_that_does_not_fit_is_refused_before_the_run_dir(tmp_path, monkeypatch, capsys):
    from zbrl.launch import preflight

    monkeypatch.setattr(preflight, "visible_gpu_memory", lambda: 24 * GIB)
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            DAPO_7B,
            "model.path=Qwen/Qwen2.5-7B",
            "rollout.backend=transformers",  # vLLM is not installed here
            "rollout.inference_microbatch_size=1",  # its KV cache fits the 24 GiB GPU
            f"logging.run_dir={run_dir}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("error: the memory plan does not fit")
    assert "cpu_offload: true" in err[0]
    assert not run_dir.exists()


def test_cpu_runs_are_not_judged(monkeypatch):
    from zbrl.launch import preflight

    def no_gpu_query():
        raise AssertionError("a CPU run asked for the GPU's memory")

    monkeypatch.setattr(preflight, "visible_gpu_memory", no_gpu_query)
    assert preflight.check_memory_plan(load_config(None)) is True


def test_a_gpu_run_that_fits_passes(monkeypatch):
    from zbrl.launch import preflight

    monkeypatch.setattr(preflight, "visible_gpu_memory", lambda: 80 * GIB)
    assert preflight.check_memory_plan(load_config(DAPO_7B)) is True
    monkeypatch.setattr(preflight, "visible_gpu_memory", lambda: 8 * GIB)
    with pytest.raises(RunError, match="does not fit"):
        preflight.check_memory_plan(load_config(DAPO_7B))


def test_one_fix_per_kind_the_largest_micro_batch_that_fits(capsys):
    recipe = str(ROOT / "recipes" / "grpo_qwen2.5_0.5b_instruct_gpu.yaml")
    assert main(["plan", "--memory", recipe, "--gpu-gb", "40", "--json"]) == 1
    fixes = [" ".join(f["overrides"]) for f in json.loads(capsys.readouterr().out)["fixes"]]
    assert "model.gradient_checkpointing=true" in fixes
    micro = [f for f in fixes if "microbatch" in f]
    assert micro == ["training.train_microbatch_tokens=8192"]  # half the recipe's 16384
