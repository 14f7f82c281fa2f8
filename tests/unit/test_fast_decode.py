"""zbrl's own decode loop (rollout/backends/transformers/fast_decode.py) against transformers'
``generate``: the same tokens from the same seed, the same log-probs, on the embedded model and
on a grouped-query Llama with biased projections; the weights it decodes with are the model's
current ones; models and settings it does not handle go to ``generate``, with the reason."""

import pytest
import torch
from role_settings import sampling_params
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from zbrl.rollout.backends.transformers.backend import TransformersBackend
from zbrl.rollout.backends.transformers.fast_decode import unsupported

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25], [1, 60, 61]]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def pair(model_of, tokenizer):
    """(zbrl's loop, transformers' ``generate``) backends over two copies of one model."""
    fast = TransformersBackend(model_of(), tokenizer)
    plain = TransformersBackend(model_of(), tokenizer, fast_decode=False)
    assert fast.decoder is not None and fast.fast_decode_off is None
    assert plain.decoder is None and plain.fast_decode_off == "fast_decode=False"
    return fast, plain


def grouped_query_model():
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=107, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
        max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=0, eos_token_id=2,
        bos_token_id=1,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # biases away from their zero initialisation, so they count
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def assert_same_completions(fast, plain, params, seed):
    torch.manual_seed(seed)
    ours = fast.generate(PROMPTS, params)
    torch.manual_seed(seed)
    theirs = plain.generate(PROMPTS, params)
    assert [len(g) for g in ours] == [len(g) for g in theirs] == [params.n] * len(PROMPTS)
    for group_a, group_b in zip(ours, theirs, strict=True):
        for a, b in zip(group_a, group_b, strict=True):
            assert a.token_ids.tolist() == b.token_ids.tolist()
            assert a.finish_reason == b.finish_reason and a.text == b.text
            torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)


SETTINGS = [
    dict(n=4, temperature=1.0),
    dict(n=3, temperature=0.7, top_k=5),
    dict(n=3, temperature=1.3, top_p=0.8),
    dict(n=2, temperature=0.9, top_k=8, top_p=0.9),
    dict(n=1, temperature=1.0),
    dict(n=3, temperature=0.0),
]


def setting_id(fields: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in fields.items())


@pytest.mark.parametrize("fields", SETTINGS, ids=setting_id)
def test_embedded_model_samples_what_generate_samples(tiny_model_dir, tokenizer, fields):
    fast, plain = pair(lambda: AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
    for seed in range(3):
        assert_same_completions(fast, plain, sampling_params(max_new_tokens=12, **fields), seed)


@pytest.mark.parametrize("fields", SETTINGS[:2] + SETTINGS[-1:], ids=["t1", "topk", "greedy"])
def test_grouped_query_attention_with_biases_samples_what_generate_samples(tokenizer, fields):
    fast, plain = pair(grouped_query_model, tokenizer)
    for seed in range(2):
        assert_same_completions(fast, plain, sampling_params(max_new_tokens=10, **fields), seed)


def test_responses_that_end_early_are_padded_and_cut_as_generate_cuts_them(
    tiny_model_dir, tokenizer
):
    """With EOS's (tied) embedding turned towards the model's hidden states, samples stop at
    many lengths within the budget, some run to it: each response ends at its EOS, as with
    ``generate``."""

    def eager_to_stop():
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        with torch.no_grad():
            emb = model.model.embed_tokens.weight
            hidden = model.model(input_ids=torch.tensor([PROMPTS[0]])).last_hidden_state[0]
            direction = hidden.mean(0) / hidden.mean(0).norm()
            emb[2] = 1.5 * direction * emb.norm(dim=1).mean()
        return model

    fast, plain = pair(eager_to_stop, tokenizer)
    params = sampling_params(n=6, temperature=1.0, max_new_tokens=16)
    assert_same_completions(fast, plain, params, seed=5)
    torch.manual_seed(5)
    out = [c for g in fast.generate(PROMPTS, params) for c in g]
    lengths = {len(c.token_ids) for c in out if c.finish_reason == "stop"}
    assert len(lengths) >= 3  # stopped at several lengths
    assert all(c.token_ids[-1] == 2 for c in out if c.finish_reason == "stop")


def test_it_decodes_with_the_weights_loaded_after_it_was_built(tiny_model_dir, tokenizer):
    fast, plain = pair(lambda: AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
    params = sampling_params(n=3, temperature=0.0, max_new_tokens=10)
    before = [c.token_ids.tolist() for g in fast.generate(PROMPTS, params) for c in g]
    torch.manual_seed(11)
    state = {k: v + 0.2 * torch.randn_like(v) for k, v in plain.model.state_dict().items()}
    fast.load_weights(state)
    plain.load_weights(state)
    after = [c.token_ids.tolist() for g in fast.generate(PROMPTS, params) for c in g]
    assert after != before
    assert_same_completions(fast, plain, params, seed=0)


def test_stop_strings_go_to_generate(tiny_model_dir, tokenizer, monkeypatch):
    fast = TransformersBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)

    def refuse(*args, **kwargs):
        raise AssertionError("the loop was called with stop strings")

    monkeypatch.setattr(fast.decoder, "decode", refuse)
    out = fast.generate(PROMPTS, sampling_params(n=2, temperature=0.0, stop_strings=("3",)))
    assert [len(g) for g in out] == [2] * len(PROMPTS)
    with pytest.raises(AssertionError, match="the loop was called"):
        fast.generate(PROMPTS, sampling_params(n=2, temperature=0.0))


def llama(**fields):
    base = dict(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(LlamaConfig(**{**base, **fields}))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
         "rope_type 'linear'"),
        (lambda: llama(mlp_bias=True), "mlp_bias"),
        (lambda: llama(hidden_act="gelu"), "hidden_act 'gelu'"),
    ],
    ids=["rope-scaling", "mlp-bias", "gelu"],
)  # fmt: skip
def test_models_it_does_not_handle_are_named_and_left_to_generate(make, reason, tokenizer):
    model = make()
    assert reason in unsupported(model)
    backend = TransformersBackend(model, tokenizer)
    assert backend.decoder is None and reason in backend.fast_decode_off
    out = backend.generate([[1, 5, 6]], sampling_params(n=2, temperature=0.0, max_new_tokens=4))
    assert len(out[0]) == 2


def test_a_generation_config_with_its_own_processors_is_left_to_generate(tokenizer):
    model = llama()
    model.generation_config.repetition_penalty = 1.3
    assert "repetition_penalty" in unsupported(model)
    assert TransformersBackend(model, tokenizer).decoder is None


def test_other_model_types_are_left_to_generate(tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    assert "model_type 'qwen2'" in unsupported(Qwen2ForCausalLM(config))


def test_the_own_loop_is_off_on_a_gpu_until_checked_there():
    """Until bench/gpu_check.py has passed on a GPU, a backend on one uses ``generate`` and says
    why; the CPU keeps the loop."""
    from zbrl.rollout.backends.transformers.backend import fast_decode_device_off

    assert fast_decode_device_off(torch.device("cpu")) is None
    reason = fast_decode_device_off(torch.device("cuda", 0))
    assert reason == "device cuda (zbrl's loop is checked on the CPU only: bench/gpu_check.py)"
