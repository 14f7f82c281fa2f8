"""LoRA (``model.lora``, docs/scaling.md): adapters trained on a frozen float32 base, only the
adapters published (cast to the inference dtype) and checkpointed, merged on the receiving side
from an unmerged copy of the base (no compounding across versions), checkpoints that resume the
adapters and their optimizer state bit for bit and load with peft. The embedded tiny model, one
process."""

from __future__ import annotations

import pytest
import torch

from helpers.data_parallel import Case, make_groups
from zbrl.assembly.models import build_backend, build_engine
from zbrl.assembly.settings import step_settings
from zbrl.config import load_config
from zbrl.config.loader import ConfigError
from zbrl.errors import RunError
from zbrl.models.lora import AdapterMerger, is_adapter_dir
from zbrl.training.checkpoint import TRAINER_FILE, load_state, save_checkpoint
from zbrl.training.train_step import Trainer
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.factory import build_publisher
from zbrl.transport.weight_sync.store import WeightStore

pytest.importorskip("peft")

LORA = (
    "training.device=cpu",
    "training.train_batch_size=4",
    "model.lora.rank=4",
    "model.lora.alpha=8",
    "algorithm.lr=1e-2",
)
Q_PROJ = "model.layers.0.self_attn.q_proj"
LAYERS, TARGETS = 2, 7  # the tiny model's decoder blocks; the default targets per block


def config(*overrides: str):
    return load_config(None, [*LORA, *overrides])


def batch(engine, seed: int):
    return make_groups(
        Case("lora", (), 4, group_size=4, seed=seed), engine.policy.config.vocab_size
    )


def randomise_b(engine, seed: int) -> None:
    """peft starts every ``B`` at zero (the adapter adds nothing); give it values so a merge has
    something to show."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in engine.policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def test_only_the_adapters_train_and_the_base_stays_as_loaded(tiny_model_dir):
    from safetensors.torch import load_file

    engine = build_engine(config(), tiny_model_dir, total_steps=4)
    trainable = [n for n, p in engine.policy.named_parameters() if p.requires_grad]
    assert len(trainable) == 2 * LAYERS * TARGETS
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {p.dtype for p in engine.policy.parameters()} == {torch.float32}
    opt_params = [p for g in engine.optimizer.param_groups for p in g["params"]]
    assert len(opt_params) == len(trainable)
    before = {k: v.clone() for k, v in engine.full_state_dict().items()}
    trainer = Trainer(engine, step_settings(config(), pad_id=0))
    for step in range(2):
        trainer.train(batch(engine, seed=step))
    after = engine.full_state_dict()
    assert any(not torch.equal(after[k], before[k]) for k in before)  # the adapters learned
    base = load_file(tiny_model_dir / "model.safetensors")
    merged_names = engine.policy.get_base_model().state_dict()
    for name, tensor in base.items():
        live = merged_names.get(
            name, merged_names.get(name.replace(".weight", ".base_layer.weight"))
        )
        assert torch.equal(live, tensor), name


def test_only_adapter_tensors_are_published_in_the_inference_dtype(tiny_model_dir):
    engine = build_engine(config(), tiny_model_dir, total_steps=2)
    weights = engine.full_state_dict()
    assert len(weights) == 2 * LAYERS * TARGETS
    assert all(k.startswith("base_model.model.") and ".lora_" in k for k in weights)
    store = WeightStore()
    publisher = build_publisher(
        config().transport.weight_sync,
        WeightStoreClient(LocalHandle(store)),
        dtype=torch.bfloat16,
    )
    try:
        publisher.publish(1, weights)
        publisher.flush(timeout=10)
    finally:
        publisher.close()
    payload = store.latest().payload
    assert payload.keys() == weights.keys()
    assert {t.dtype for t in payload.values()} == {torch.bfloat16}
    sent = sum(t.numel() * t.element_size() for t in payload.values())
    full = sum(p.numel() for p in engine.policy.get_base_model().parameters()) * 2
    assert sent < full / 10  # rank 4 on 128-wide layers: 8.6% of the trained weights' count


def test_the_merged_receiver_computes_what_the_peft_model_computes(tiny_model_dir):
    engine = build_engine(config(), tiny_model_dir, total_steps=2)
    randomise_b(engine, seed=1)
    backend = build_backend(config(), tiny_model_dir, tiny_model_dir)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = backend.model(input_ids=ids).logits
        backend.load_weights(engine.full_state_dict())
        merged = backend.model(input_ids=ids).logits
        want = engine.policy.eval()(input_ids=ids).logits
    assert not torch.allclose(plain, want, atol=1e-3)  # the adapters change the outputs
    torch.testing.assert_close(merged, want, atol=1e-5, rtol=1e-5)


def test_versions_do_not_compound_each_merge_starts_from_the_base(tiny_model_dir):
    engine = build_engine(config(), tiny_model_dir, total_steps=2)
    randomise_b(engine, seed=1)
    v1 = {k: v.clone() for k, v in engine.full_state_dict().items()}
    randomise_b(engine, seed=2)
    v2 = {k: v.clone() for k, v in engine.full_state_dict().items()}
    twice = build_backend(config(), tiny_model_dir, tiny_model_dir)
    twice.load_weights(v1)
    twice.load_weights(v2)
    once = build_backend(config(), tiny_model_dir, tiny_model_dir)
    once.load_weights(v2)
    for (name, a), (_, b) in zip(
        twice.model.state_dict().items(), once.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_a_bf16_receiver_merges_in_float32_and_keeps_its_base_copy_in_bf16(tiny_model_dir):
    cfg = config("model.dtype=bfloat16")
    engine = build_engine(cfg, tiny_model_dir, total_steps=2)
    randomise_b(engine, seed=3)
    backend = build_backend(cfg, tiny_model_dir, tiny_model_dir)
    name = "model.layers.0.self_attn.q_proj"
    base = backend.model.get_submodule(name).weight.detach().clone()
    adapters = {k: v.bfloat16() for k, v in engine.full_state_dict().items()}
    backend.load_weights(adapters)
    a = adapters[f"base_model.model.{name}.lora_A.weight"].float()
    b = adapters[f"base_model.model.{name}.lora_B.weight"].float()
    want = (base.float() + 2.0 * b @ a).bfloat16()  # scale alpha / rank = 8 / 4
    assert torch.equal(backend.model.get_submodule(name).weight, want)
    # the unmerged copy: every adapted weight (4 attention 128x128, 3 MLP 128x512 per block)
    assert backend.merger.base_bytes == LAYERS * (4 * 128 * 128 + 3 * 128 * 512) * 2


def test_a_receiver_refuses_full_weights_by_name(tiny_model_dir):
    backend = build_backend(config(), tiny_model_dir, tiny_model_dir)
    with pytest.raises(ValueError, match="not a LoRA adapter tensor"):
        backend.load_weights({"model.norm.weight": torch.ones(128)})
    merger = AdapterMerger(backend.model, 1.0)
    with pytest.raises(ValueError, match="lacks lora_A or lora_B"):
        merger.apply(
            {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 128)}
        )


@pytest.fixture(scope="module")
def checkpointed(tiny_model_dir, tmp_path_factory):
    """Three LoRA steps, then a checkpoint as the consumer writes it (adapters in peft format,
    the engine state without them)."""
    cfg = config()
    torch.manual_seed(0)
    engine = build_engine(cfg, tiny_model_dir, total_steps=10)
    trainer = Trainer(engine, step_settings(cfg, pad_id=0))
    for step in range(3):
        trainer.train(batch(engine, seed=10 + step))
    state = engine.state_dict()
    saved = state.pop("policy")
    path = tmp_path_factory.mktemp("lora-ckpt") / "step-3"
    save_checkpoint(engine, None, path, state={TRAINER_FILE: {"engine": state}})
    return cfg, engine, trainer, path, saved, state


def test_the_checkpoint_holds_the_float32_adapters_only(checkpointed, tiny_model_dir):
    from safetensors.torch import load_file

    path, saved = checkpointed[3], checkpointed[4]
    assert is_adapter_dir(path) and not (path / "model.safetensors").exists()
    on_disk = load_file(path / "adapter_model.safetensors")
    assert on_disk.keys() == saved.keys()
    for name, tensor in saved.items():
        assert on_disk[name].dtype == torch.float32 and torch.equal(on_disk[name], tensor), name


def test_the_checkpoint_loads_with_peft_and_merges_to_a_plain_model(checkpointed, tiny_model_dir):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    engine, path = checkpointed[1], checkpointed[3]
    ids = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = engine.policy.eval()(input_ids=ids).logits
        loaded = AutoPeftModelForCausalLM.from_pretrained(path)
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
        plain = loaded.merge_and_unload()
        assert type(plain).__name__ == "LlamaForCausalLM"
        torch.testing.assert_close(plain(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
        via_transformers = AutoModelForCausalLM.from_pretrained(path)  # base + adapters
        torch.testing.assert_close(
            via_transformers(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5
        )
        # `zbrl eval --model step-N` builds its backend from the checkpoint the same way
        backend = build_backend(load_config(None, ["training.device=cpu"]), path, tiny_model_dir)
        torch.testing.assert_close(backend.model(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)


def test_resume_restores_the_adapters_and_their_optimizer_state_bit_for_bit(checkpointed):
    cfg, engine, trainer, path, saved, state = checkpointed
    resumed = build_engine(cfg, path, total_steps=10)  # as `zbrl resume`: from step-3
    resumed.load_state_dict(load_state(path / "zbrl" / TRAINER_FILE)["engine"])
    for name, tensor in resumed.full_state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    got, want = resumed.optimizer.state_dict()["state"], state["optimizer"]["state"]
    assert got.keys() == want.keys() and len(got) == 2 * LAYERS * TARGETS
    for index, moments in want.items():
        for key, value in moments.items():
            assert torch.equal(got[index][key], value), (index, key)
    follow_up = batch(engine, seed=99)
    trainer.train(follow_up)
    Trainer(resumed, step_settings(cfg, pad_id=0)).train(follow_up)
    continued = engine.full_state_dict()
    for name, tensor in resumed.full_state_dict().items():
        assert torch.equal(tensor, continued[name]), name


def test_a_lora_checkpoint_without_model_lora_is_refused_by_name(checkpointed):
    path = checkpointed[3]
    with pytest.raises(RunError, match=r"LoRA checkpoint.*model\.lora is not set"):
        build_engine(load_config(None, ["training.device=cpu"]), path, total_steps=2)


def test_target_modules_not_in_the_model_are_named_with_the_ones_that_are(tiny_model_dir):
    with pytest.raises(RunError, match=r"target_modules=\['c_attn'\].*'q_proj'"):
        build_engine(config("model.lora.target_modules=[c_attn]"), tiny_model_dir, 2)


@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ("rollout.backend=vllm model.lora.rank=1024", "rollout.backend.lora_mode=merged"),
        ("training.engine=fsdp2", "training.engine=ddp"),
        ("algorithm.preset=ppo", "algorithm.advantage=grpo"),
    ],
)
def test_unsupported_combinations_are_refused_with_the_fix(override, fix):
    extra = ("launch.num_consumers=2",) if "fsdp2" in override else ()
    with pytest.raises(ConfigError, match=f"model.lora.*{fix}"):
        config(*override.split(), *extra)


def test_lora_with_the_vllm_backend_is_accepted():
    assert config("rollout.backend=vllm").model.lora.rank == 4
    merged = "rollout.backend={type: vllm, lora_mode: merged}"
    assert config(merged, "model.lora.rank=1024").rollout.backend.lora_mode == "merged"


def test_lora_section_defaults_target_every_linear_layer_of_a_llama_block():
    lora = config().model.lora
    assert (lora.rank, lora.alpha, lora.dropout) == (4, 8.0, 0.0)
    assert lora.target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    assert load_config(None, []).model.lora is None


def test_eval_of_a_lora_checkpoint_checks_its_base(checkpointed, tmp_path):
    import json
    import shutil

    from zbrl.assembly.input_checks import check_lora_checkpoint

    path = checkpointed[3]
    check_lora_checkpoint(path)  # the base is there (either backend takes it)
    moved = shutil.copytree(path, tmp_path / "step-3")
    config_file = moved / "adapter_config.json"
    config_file.write_text(
        json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path": "/gone"})
    )
    with pytest.raises(RunError, match="edit base_model_name_or_path"):
        check_lora_checkpoint(moved)


def test_a_lora_checkpoint_is_served_without_peft(checkpointed, tiny_model_dir, monkeypatch):
    """The receiving side (zbrl eval, producers) merges the adapters itself: with peft unimportable
    the checkpoint passes eval's checks and generates what the merged model computes."""
    import sys

    from zbrl.assembly.input_checks import check_lora_checkpoint
    from zbrl.models import lora

    path = checkpointed[3]
    with_peft = build_backend(load_config(None, []), path, tiny_model_dir)
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    assert not lora.peft_available()
    check_lora_checkpoint(path)
    without = build_backend(load_config(None, []), path, tiny_model_dir)
    for name, tensor in with_peft.model.state_dict().items():
        assert torch.equal(without.model.state_dict()[name], tensor), name


def test_the_kl_reference_of_a_lora_checkpoint_is_its_base(checkpointed, tiny_model_dir):
    from safetensors.torch import load_file

    path = checkpointed[3]
    engine = build_engine(config("algorithm.beta=0.1"), path, total_steps=2)
    base = load_file(tiny_model_dir / "model.safetensors")
    reference = engine.reference.state_dict()
    for name, tensor in base.items():
        assert torch.equal(reference[name], tensor), name


def test_a_lora_run_without_peft_is_refused_before_it_starts(monkeypatch):
    from zbrl.assembly.input_checks import check_backend_installed
    from zbrl.models import lora

    monkeypatch.setattr(lora, "peft_available", lambda: False)
    with pytest.raises(RunError, match=r"model\.lora is set, but peft is not.*zbrl\[lora\]"):
        check_backend_installed(config())
    check_backend_installed(load_config(None, []))  # no LoRA: no peft needed


def test_the_summary_weight_sync_size_is_the_median_published_version(tmp_path):
    from types import SimpleNamespace

    from zbrl.launch.summary import weight_sync_bytes
    from zbrl.telemetry.spans import PUBLISH_WEIGHTS, TRAIN_STEP, SpanRecorder
    from zbrl.telemetry.timeline import TimelineWriter

    monitor = SimpleNamespace(run_dir=tmp_path, window_start=10.0)
    assert weight_sync_bytes(monitor) is None  # no timeline yet
    recorder = SpanRecorder("consumer-0", "consumer")
    recorder.record(PUBLISH_WEIGHTS, 1.0, 2.0, thread="weights", version=1, bytes=999)  # earlier
    for version, size in enumerate((300, 100, 200), start=2):
        recorder.record(PUBLISH_WEIGHTS, 11.0, 12.0, thread="weights", version=version, bytes=size)
    recorder.record(TRAIN_STEP, 11.0, 12.0)
    TimelineWriter(tmp_path).write(recorder.drain())
    assert weight_sync_bytes(monitor) == 200


def test_adapters_get_gradients_under_gradient_checkpointing(tiny_model_dir):
    engine = build_engine(config("model.gradient_checkpointing=true"), tiny_model_dir, 2)
    randomise_b(engine, seed=4)  # with B = 0, A's gradient is zero whatever happens
    engine.zero_grad()
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(5))
    logits = engine.policy(input_ids=ids).logits
    engine.backward(logits.float().logsumexp(-1).mean())
    grads = {n: p.grad for n, p in engine.policy.named_parameters() if p.requires_grad}
    assert len(grads) == 2 * LAYERS * TARGETS
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())
