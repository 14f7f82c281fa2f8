"""The model families of 2026 through zbrl, on tiny random models built from transformers' own
config classes (:mod:`zbrl.testing.model_families`): shared-prompt training and generation on
hybrid linear-attention caches, the packed layout where it is correct (and the leak that makes
zbrl refuse it elsewhere), the MoE router's load balance, layer-type checks, LoRA targets and
the memory planner's shapes."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from zbrl.errors import RunError
from zbrl.models.layer_types import check_layer_types, check_model_layers
from zbrl.models.moe import RouterRecorder, load_balance, moe_shape
from zbrl.planning.model_shape import ModelShape, shape_from_config
from zbrl.testing.model_families import create_family_dir
from zbrl.training.rows import collate

sys.path.insert(0, str(Path(__file__).parent))
from test_model_inputs import random_rows, token_logprobs

FAST = ("qwen3", "qwen3_moe", "qwen3_5_text", "gpt_oss")
MOE = ("qwen3_moe", "gpt_oss")
PACKS = {
    "qwen3": True,
    "qwen3_moe": True,
    "qwen3_5_text": False,
    "gpt_oss": False,
    "qwen3_next": False,
}
"""Whether the packed layout gives the full rows' log-probs (sliding and linear attention: no)."""


ALL = (*FAST, pytest.param("qwen3_next", marks=pytest.mark.slow))
"""Qwen3-Next (hybrid and MoE) adds ~4 s on 2 cores (its first forward and backward): slow tier."""


class _FamilyDirs(dict):
    """Each family's model directory, written the first time a test asks for it."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, family: str) -> Path:
        self[family] = create_family_dir(family, self.root / family)
        return self[family]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    return _FamilyDirs(tmp_path_factory.mktemp("families"))


def _load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _layout_results(model, rows, layout: str):
    model.zero_grad(set_to_none=True)
    mb = collate(rows, pad_id=0, share_prompts=layout == "shared", packed=layout == "packed")
    logp, loss = token_logprobs(model, mb)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), grads


@pytest.mark.parametrize("family", ALL)
def test_layouts_against_full_rows(family_dirs, family):
    """Shared prompts give the full rows' log-probs and gradients in every family (through a
    linear-attention layer's selected recurrent state too); packing does only where every
    layer is full attention, and visibly leaks elsewhere (why it is refused there)."""
    torch.manual_seed(0)
    model = _load(family_dirs[family]).train()
    rows = random_rows(model.config.vocab_size, 0)
    full_logp, full_grads = _layout_results(model, rows, "full")
    shared_logp, shared_grads = _layout_results(model, rows, "shared")
    torch.testing.assert_close(shared_logp, full_logp, rtol=1e-5, atol=1e-5)
    assert shared_grads.keys() == full_grads.keys()
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    packed_logp, _ = _layout_results(model, rows, "packed")
    leak = float((packed_logp - full_logp).abs().max())
    if PACKS[family]:
        assert leak < 1e-5
    else:
        assert leak > 1e-3


@pytest.mark.parametrize("family", ALL)
def test_shared_prefill_generation_matches_recomputed_logprobs(family_dirs, family):
    """Sampling several completions per prompt from one prefilled cache repeated per sample
    (hybrid caches: conv and recurrent states repeated too): each completion's log-probs equal
    a full forward over prompt + completion."""
    from zbrl.embedded.tokenizer import build_tokenizer
    from zbrl.rollout.backends.base import SamplingParams
    from zbrl.rollout.backends.transformers.backend import TransformersBackend

    torch.manual_seed(0)
    model = _load(family_dirs[family])
    backend = TransformersBackend(model, build_tokenizer(), fast_decode=False)
    prompts = [[5, 9, 14, 3, 22], [7, 8]]
    params = SamplingParams(
        n=3, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=6, stop_strings=()
    )
    groups = backend.generate(prompts, params)
    assert [len(g) for g in groups] == [3, 3]
    for prompt, group in zip(prompts, groups, strict=True):
        for completion in group:
            tokens = list(completion.token_ids)
            if not tokens:
                continue
            ids = torch.tensor([prompt + tokens])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            want = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(prompt) :, None])
            got = torch.as_tensor(completion.logprobs, dtype=torch.float32)
            torch.testing.assert_close(got, want[:, 0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", [*MOE, pytest.param("qwen3_next", marks=pytest.mark.slow)])
def test_router_load_balance_equals_the_models_own_aux_loss(family_dirs, family):
    """zbrl's load-balancing loss from hooked router logits and a real-token mask equals the
    one the model computes itself from a 2-D attention mask (padding excluded)."""
    model = _load(family_dirs[family])
    shape = moe_shape(model)
    assert shape is not None and shape.num_experts == 4 and shape.top_k == 2
    assert shape.aux_coef == pytest.approx(0.001)
    recorder = RouterRecorder(model, shape)
    ids = torch.randint(3, 60, (3, 7), generator=torch.Generator().manual_seed(0))
    attention = torch.ones(3, 7, dtype=torch.long)
    attention[0, 5:] = 0
    attention[1, 6:] = 0
    with recorder.recording():
        out = model(input_ids=ids, attention_mask=attention, output_router_logits=True)
    pairs = recorder.per_layer([attention.bool()])
    balance = load_balance(pairs, shape.num_experts, shape.top_k, recorder.routers_per_pass)
    assert float(balance.aux_loss) == pytest.approx(float(out.aux_loss.detach()), rel=1e-6)
    assert 1.0 <= balance.imbalance <= shape.num_experts / shape.top_k


def test_load_balance_hand_computed():
    """Two experts, top-1, one layer: tokens route 2:1 with mean probabilities (0.6, 0.4) ->
    E · Σ f·P = 2 · (2/3·0.6 + 1/3·0.4); the busiest expert has 4/3 of the mean load; the
    padding token is left out."""
    p = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.01, 0.99]])
    logits = p.log()
    mask = torch.tensor([True, True, True, False])
    balance = load_balance([(logits, mask)], num_experts=2, top_k=1, layers=1)
    assert float(balance.aux_loss) == pytest.approx(2 * (2 / 3 * 0.6 + 1 / 3 * 0.4), rel=1e-5)
    assert balance.imbalance == pytest.approx(4 / 3)


def test_moe_step_reports_load_balance_and_adds_the_aux_loss(family_dirs):
    """A Qwen3-MoE train step reports router_aux_loss and expert_load_imbalance; the router
    gets the aux loss's gradient (its coefficient raised so it shows)."""
    from role_settings import run_config

    from helpers.data_parallel import Case, first_step, make_groups
    from zbrl.assembly.models import build_trainer

    class _Tok:
        pad_token_id = 0

    cfg = run_config("algorithm.lr=1e-3", "training.train_microbatch_size=4")
    trainer = build_trainer(cfg, family_dirs["qwen3_moe"], _Tok(), total_steps=4)
    assert trainer.routers is not None
    groups = make_groups(Case("moe", (), 3, group_size=3), vocab=50)
    grads, metrics = first_step(trainer, groups)
    assert metrics["router_aux_loss"] >= 2.0 - 1e-4  # top-2: 2.0 when perfectly balanced
    assert metrics["expert_load_imbalance"] >= 1.0
    off = build_trainer(cfg, family_dirs["qwen3_moe"], _Tok(), total_steps=4)
    off.routers = RouterRecorder(off.engine.policy, replace(off.routers.shape, aux_coef=0.0))
    grads_off, metrics_off = first_step(off, groups)
    assert metrics_off["router_aux_loss"] == pytest.approx(metrics["router_aux_loss"])
    router = "model.layers.0.mlp.gate.weight"
    assert float((grads[router] - grads_off[router]).abs().max()) > 1e-6  # the aux loss's part
    attention = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(grads[attention], grads_off[attention], atol=1e-4, rtol=1e-2)
    dense = build_trainer(cfg, family_dirs["qwen3"], _Tok(), total_steps=4)
    assert dense.routers is None


@pytest.mark.parametrize("family", ALL)
def test_shape_counts_every_parameter(family_dirs, family):
    """The planner's parameter count from config.json equals the built model's."""
    model = _load(family_dirs[family])
    config = json.loads((family_dirs[family] / "config.json").read_text())
    shape = shape_from_config(config, family)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert (shape.active_params < shape.params) == (family in (*MOE, "qwen3_next"))


def test_qwen3_30b_a3b_total_and_active_hand_computed():
    """Qwen3-30B-A3B's public config: 48 layers, hidden 2048, 32 heads / 4 KV heads of 128,
    128 experts of width 768, 8 active, vocabulary 151936, untied head.
    attention = 2048·4096 + 2·2048·512 + 4096·2048 + 2·128 = 18,874,624; one expert
    3·2048·768 = 4,718,592; router 128·2048 = 262,144; norms 2·2048.
    total = 48·(18,874,624 + 128·4,718,592 + 262,144 + 4,096) + 2·151936·2048 + 2048
          = 30,532,122,624 (the model card: 30.5B);
    active = 48·(18,874,624 + 8·4,718,592 + 262,144 + 4,096) + 622,331,904
           = 3,353,032,704 (the model card: 3.3B)."""
    config = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }
    shape = shape_from_config(config, "Qwen3-30B-A3B")
    assert shape.params == 30_532_122_624
    assert shape.active_params == 3_353_032_704
    assert shape.mlp_intermediate == 8 * 768


def test_hybrid_state_in_place_of_kv_cache_hand_computed(family_dirs):
    """The tiny Qwen3.5: 3 linear-attention layers and 1 full-attention layer. KV per token:
    1 layer · 2 KV heads · 16 · 2 (K and V) · 4 B = 256 B; state per sequence per linear layer:
    conv (2·2·16 + 4·16 = 128 channels) · kernel 4 = 512, recurrent 4 heads · 16 · 16 = 1024:
    3 · 1536 · 4 B = 18,432 B, whatever the length."""
    from zbrl.planning.memory import kv_bytes_per_token, state_bytes_per_sequence

    config = json.loads((family_dirs["qwen3_5_text"] / "config.json").read_text())
    shape = shape_from_config(config, "qwen3.5")
    assert (shape.linear_layers, shape.attention_layers) == (3, 1)
    assert kv_bytes_per_token(shape, 4) == 256
    assert state_bytes_per_sequence(shape, 4) == 18_432
    dense = ModelShape(4, 64, 128, 4, 2, 16, 100, True)
    assert kv_bytes_per_token(dense, 4) == 1024 and state_bytes_per_sequence(dense, 4) == 0


@pytest.mark.parametrize("family", ALL)
def test_layer_types_and_packing_checked_before_the_run(family_dirs, family):
    """Every family runs; packing is refused by name where a layer type does not pack."""
    where = f"model.path={family}"
    types = check_model_layers(family_dirs[family], packing=False, where=where)
    assert set(types) <= {"full_attention", "sliding_attention", "linear_attention"}
    if PACKS[family]:
        check_model_layers(family_dirs[family], packing=True, where=where)
        return
    kind = "sliding_attention" if family == "gpt_oss" else "linear_attention"
    with pytest.raises(RunError, match=f"training.packing=true, but its layers .* {kind!r}"):
        check_model_layers(family_dirs[family], packing=True, where=where)


def test_an_unknown_layer_type_is_refused_by_name():
    with pytest.raises(RunError, match=r"layers 1, 3 are 'mamba', a layer type zbrl does not run"):
        check_layer_types(["full_attention", "mamba"] * 2, packing=False, where="model.path=x")


@pytest.mark.parametrize("family", FAST)
def test_default_lora_targets_exist_in_each_family(family_dirs, family):
    """model.lora's default targets match linear layers of every family (attention
    projections everywhere; the MoE experts are fused 3-D weights, not linear layers)."""
    from zbrl.config.model import LoraConfig
    from zbrl.models.lora import check_targets

    check_targets(family_dirs[family], LoraConfig())
    model = _load(family_dirs[family])
    names = {
        n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    }
    assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= names


@pytest.mark.parametrize("family", FAST)
def test_inflight_swap_recomputes_the_cache_of_every_family(family_dirs, family):
    """Chunked generation with new weights after the second chunk (the cache recomputed under
    them, a hybrid cache's states too): the tokens before the swap carry the old weights'
    log-probs, those after it the new weights' (each against a fresh forward pass)."""
    import copy

    from role_settings import sampling_params

    from helpers.backends import reference_logprobs
    from zbrl.embedded.tokenizer import build_tokenizer
    from zbrl.rollout.backends.transformers.backend import TransformersBackend
    from zbrl.rollout.inflight import InflightSwap, generate_inflight

    backend = TransformersBackend(_load(family_dirs[family]), build_tokenizer())
    old_model = copy.deepcopy(backend.model)
    torch.manual_seed(3)
    new_weights = {k: v + 0.05 * torch.randn_like(v) for k, v in backend.model.state_dict().items()}
    new_model = copy.deepcopy(backend.model)
    new_model.load_state_dict(new_weights)
    calls = []

    def swap():  # version 4 for the first two chunks, then version 5
        calls.append(1)
        if len(calls) == 3:
            backend.load_weights(new_weights)
        return 4 if len(calls) < 3 else 5

    prompts = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25]]
    params = sampling_params(n=2, temperature=0.8, max_new_tokens=10)
    torch.manual_seed(1)
    groups = generate_inflight(backend, prompts, params, InflightSwap(3, swap))
    spanning = 0
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            n = c.token_ids.numel()
            assert c.versions.tolist() == ([4] * 6 + [5] * 4)[:n]
            old = reference_logprobs(old_model, prompt, c.token_ids, 0.8)
            new = reference_logprobs(new_model, prompt, c.token_ids, 0.8)
            torch.testing.assert_close(c.logprobs[:6], old[:6], atol=1e-4, rtol=0)
            if n > 6:
                spanning += 1
                torch.testing.assert_close(c.logprobs[6:], new[6:], atol=1e-4, rtol=0)
    assert spanning >= 2


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_text"])
def test_lora_step_trains_only_adapters_on_the_default_targets(family_dirs, family):
    """A LoRA step on an MoE and a hybrid model: the default targets get adapters (attention
    projections, plus the dense MLP's), only adapters are trainable, and the step moves them;
    the MoE model still reports its load balance through the peft wrapper."""
    pytest.importorskip("peft")
    from role_settings import run_config

    from helpers.data_parallel import Case, make_groups
    from zbrl.assembly.models import build_trainer

    class _Tok:
        pad_token_id = 0

    cfg = run_config("model.lora.rank=4", "model.lora.alpha=8", "algorithm.lr=1e-2")
    trainer = build_trainer(cfg, family_dirs[family], _Tok(), total_steps=4)
    policy = trainer.engine.policy
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert any(".q_proj." in n for n in trainable)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if n in trainable}
    metrics = trainer.train(make_groups(Case("lora", (), 3, group_size=3), vocab=50))
    after = dict(policy.named_parameters())
    assert any(not torch.equal(after[n].detach(), v) for n, v in before.items())
    assert ("router_aux_loss" in metrics) == (family == "qwen3_moe")


def test_one_token_responses_on_a_hybrid_cache(family_dirs):
    """Responses of one token continue the selected linear-attention states through the model's
    single-step path (its in-place convolution update): still the full rows' log-probs and
    gradients."""
    from test_model_inputs import make_row

    model = _load(family_dirs["qwen3_5_text"]).train()
    rows = [make_row([5, 6, 7, 8], [9]), make_row([5, 6, 7, 8], [10]), make_row([3, 4], [11])]
    full_logp, full_grads = _layout_results(model, rows, "full")
    shared_logp, shared_grads = _layout_results(model, rows, "shared")
    torch.testing.assert_close(shared_logp, full_logp, rtol=1e-5, atol=1e-5)
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_model_source_check_refuses_packing_a_hybrid_model(family_dirs):
    """The pre-flight's model check (before any run directory) runs the layer-type check."""
    from role_settings import run_config

    from zbrl.assembly.model_source import resolve_model_source

    model = f"model.path={family_dirs['qwen3_5_text']}"
    allow = "data.allow_embedded_task_with_user_model=true"
    resolved = resolve_model_source(run_config(model, allow), verbose=False)
    assert resolved.model_dir == family_dirs["qwen3_5_text"]
    with pytest.raises(RunError, match=r"'linear_attention': it reads no attention mask"):
        resolve_model_source(run_config(model, allow, "training.packing=true"), verbose=False)
