"""TransformersBackend on the embedded tiny model: ordering, lengths, finish reasons, behaviour
log-probs against a fresh forward pass, greedy decoding, left padding, weight loading."""

import pytest
import torch
from role_settings import sampling_params
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.backends import reference_logprobs
from zbrl.rollout.backends.transformers.backend import TransformersBackend

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25]]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def backend(tiny_model_dir, tokenizer):
    return TransformersBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)


def greedy(n=1, max_new_tokens=6, **kw):
    return sampling_params(n=n, temperature=0.0, max_new_tokens=max_new_tokens, **kw)


def test_generate_returns_n_completions_per_prompt_with_valid_finish(backend, tokenizer):
    torch.manual_seed(0)
    params = sampling_params(n=4, temperature=1.0, max_new_tokens=8)
    out = backend.generate(PROMPTS, params)
    assert len(out) == len(PROMPTS)
    assert all(len(group) == 4 for group in out)
    eos = tokenizer.eos_token_id
    for group in out:
        for c in group:
            assert c.token_ids.dtype == torch.int64 and c.token_ids.dim() == 1
            assert c.logprobs.dtype == torch.float32
            assert c.logprobs.shape == c.token_ids.shape
            assert (c.logprobs <= 0).all()
            n = c.token_ids.numel()
            assert n <= params.max_new_tokens
            ids = c.token_ids.tolist()
            assert eos not in ids[:-1]  # nothing kept after the first EOS
            if c.finish_reason == "length":
                assert n == params.max_new_tokens and eos not in ids
            else:
                assert c.finish_reason == "stop"
                assert n < params.max_new_tokens or ids[-1] == eos
            assert c.text == tokenizer.decode(ids, skip_special_tokens=True)
    assert backend.generate([], params) == []


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_match_forward_pass(backend, temperature):
    torch.manual_seed(1)
    out = backend.generate(PROMPTS, sampling_params(n=3, temperature=temperature, max_new_tokens=8))
    checked = 0
    for prompt, group in zip(PROMPTS, out):  # also checks that groups come in prompt order
        for c in group:
            if c.token_ids.numel() == 0:
                continue
            ref = reference_logprobs(backend.model, prompt, c.token_ids, temperature)
            torch.testing.assert_close(c.logprobs, ref, atol=1e-4, rtol=0)
            checked += 1
    assert checked >= 6


def test_logprobs_use_the_sampling_temperature(backend):
    torch.manual_seed(2)
    out = backend.generate(PROMPTS[:1], sampling_params(n=1, temperature=0.5, max_new_tokens=4))
    c = out[0][0]
    at_half = reference_logprobs(backend.model, PROMPTS[0], c.token_ids, 0.5)
    at_one = reference_logprobs(backend.model, PROMPTS[0], c.token_ids, 1.0)
    torch.testing.assert_close(c.logprobs, at_half, atol=1e-4, rtol=0)
    assert not torch.allclose(c.logprobs, at_one, atol=1e-3)


def test_greedy_is_deterministic_and_picks_argmax(backend):
    first = backend.generate(PROMPTS, greedy())
    torch.manual_seed(123)  # greedy must not depend on the RNG
    second = backend.generate(PROMPTS, greedy())
    for prompt, g1, g2 in zip(PROMPTS, first, second):
        (a,), (b,) = g1, g2
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert torch.equal(a.logprobs, b.logprobs)
        ids = torch.tensor([prompt + a.token_ids.tolist()])
        with torch.no_grad():
            logits = backend.model(input_ids=ids).logits[0]
        p = len(prompt)
        argmax = logits[p - 1 : p - 1 + a.token_ids.numel()].argmax(-1)
        assert a.token_ids.tolist() == argmax.tolist()
        # greedy log-probs are reported at temperature 1
        ref = reference_logprobs(backend.model, prompt, a.token_ids, 1.0)
        torch.testing.assert_close(a.logprobs, ref, atol=1e-4, rtol=0)


def test_left_padding_matches_generating_each_prompt_alone(backend):
    batched = backend.generate(PROMPTS, greedy(max_new_tokens=8))
    for prompt, (together,) in zip(PROMPTS, batched):
        ((alone,),) = backend.generate([prompt], greedy(max_new_tokens=8))
        assert together.token_ids.tolist() == alone.token_ids.tolist()
        assert together.finish_reason == alone.finish_reason
        torch.testing.assert_close(together.logprobs, alone.logprobs, atol=1e-4, rtol=0)


def test_load_weights_changes_outputs_and_round_trips(backend):
    original = {k: v.clone() for k, v in backend.model.state_dict().items()}
    before = backend.generate(PROMPTS, greedy())
    gen = torch.Generator().manual_seed(0)
    perturbed = {
        k: v + 0.5 * torch.randn(v.shape, generator=gen) if "mlp" in k else v.clone()
        for k, v in original.items()
    }
    backend.load_weights(perturbed)
    changed = backend.generate(PROMPTS, greedy())
    for (b,), (c,) in zip(before, changed):
        same_tokens = b.token_ids.tolist() == c.token_ids.tolist()
        assert not (same_tokens and torch.allclose(b.logprobs, c.logprobs, atol=1e-3))
    key = next(k for k in original if "mlp" in k)
    assert torch.equal(backend.model.state_dict()[key], perturbed[key])
    backend.load_weights(original)
    restored = backend.generate(PROMPTS, greedy())
    for (b,), (r,) in zip(before, restored):
        assert b.token_ids.tolist() == r.token_ids.tolist()
        torch.testing.assert_close(b.logprobs, r.logprobs, atol=1e-6, rtol=0)


def test_load_weights_rejects_incomplete_state_dict(backend):
    partial = dict(list(backend.model.state_dict().items())[:3])
    with pytest.raises(RuntimeError, match="Missing key"):
        backend.load_weights(partial)


def eos_backend(tiny_model_dir, tokenizer, eos_id):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.generation_config.eos_token_id = eos_id
    return TransformersBackend(model, tokenizer)


def test_eos_ends_response_and_later_tokens_are_dropped(tiny_model_dir, tokenizer, backend):
    ((a,), (b,)) = backend.generate(PROMPTS[:2], greedy(max_new_tokens=6))
    eos_id = a.token_ids[0].item()  # make prompt 0's first greedy token the EOS
    assert eos_id not in b.token_ids.tolist()
    other = eos_backend(tiny_model_dir, tokenizer, eos_id)
    ((a2,), (b2,)) = other.generate(PROMPTS[:2], greedy(max_new_tokens=6))
    assert a2.token_ids.tolist() == [eos_id] and a2.finish_reason == "stop"
    assert a2.logprobs.shape == (1,)
    assert b2.token_ids.tolist() == b.token_ids.tolist() and b2.finish_reason == "length"


def test_eos_on_the_last_allowed_token_is_stop(tiny_model_dir, tokenizer, backend):
    ((a,),) = backend.generate(PROMPTS[:1], greedy(max_new_tokens=1))
    other = eos_backend(tiny_model_dir, tokenizer, a.token_ids[0].item())
    ((c,),) = other.generate(PROMPTS[:1], greedy(max_new_tokens=1))
    assert c.token_ids.numel() == 1 and c.finish_reason == "stop"


def stop_string_case(backend, tokenizer):
    """A prompt and a stop string that greedy decoding completes at its 2nd response token."""
    prompt = [1, 40, 41, 10]
    ((c,),) = backend.generate([prompt], greedy(max_new_tokens=2))
    stop = tokenizer.decode(c.token_ids.tolist(), skip_special_tokens=False)
    first = tokenizer.decode(prompt + c.token_ids[:1].tolist(), skip_special_tokens=False)
    assert stop not in first, "precondition: the stop string needs both response tokens"
    return prompt, c.token_ids.tolist(), stop


def test_stop_string_ends_response_before_budget(backend, tokenizer):
    prompt, expected, stop = stop_string_case(backend, tokenizer)
    out = backend.generate([prompt, PROMPTS[0]], greedy(max_new_tokens=5, stop_strings=(stop,)))
    ((c,), (other,)) = out
    assert c.token_ids.tolist() == expected and c.finish_reason == "stop"
    assert c.logprobs.shape == (2,)
    assert other.token_ids.numel() == 5 and other.finish_reason == "length"


def test_stop_string_on_the_last_allowed_token_is_stop(backend, tokenizer):
    prompt, expected, stop = stop_string_case(backend, tokenizer)
    ((c,),) = backend.generate([prompt], greedy(max_new_tokens=2, stop_strings=(stop,)))
    assert c.token_ids.tolist() == expected
    assert c.finish_reason == "stop"


def test_stop_string_ending_inside_a_token_ends_the_response(backend, tokenizer):
    # generate stops when a stop string ends inside the last token ("</ans" in the "</answer>"
    # token) and pads the rest: the response ends there, finished by the stop string
    ids = tokenizer.encode("x[J</answer>", add_special_tokens=False)
    assert tokenizer.decode(ids[-1:]) == "</answer>", "precondition: one token for the tag"
    padded = torch.tensor(ids + [backend.pad_id] * 3)
    assert backend.responses.end(padded, ("</ans",)) == (len(ids), True)
    assert backend.responses.end(padded, ("</answer>",)) == (len(ids), True)
    assert backend.responses.end(torch.tensor(ids), ("</ans",)) == (len(ids), True)
    # no stop string in the last token: the pad tokens may be the model's own, kept
    assert backend.responses.end(padded, ("zz",)) == (len(ids) + 3, False)
    assert backend.responses.end(padded, ("x[",)) == (len(ids) + 3, False)


def test_greedy_with_several_samples_per_prompt(backend):
    out = backend.generate(PROMPTS, greedy(n=2))
    assert [len(g) for g in out] == [2, 2, 2]
    for a, b in out:
        assert a.token_ids.tolist() == b.token_ids.tolist()


def test_sampled_pad_token_does_not_cut_the_response(backend):
    pad = backend.pad_id
    state = {k: v.clone() for k, v in backend.model.state_dict().items()}
    emb = state["model.embed_tokens.weight"]
    emb[pad] = 3 * emb[7]  # after token 7 the greedy choice becomes the pad token
    if "lm_head.weight" in state:
        state["lm_head.weight"] = emb
    backend.load_weights(state)
    prompt = [1, 40, 41, 7]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        sampled = backend.model.generate(
            input_ids=ids, max_new_tokens=4, do_sample=False, pad_token_id=pad, eos_token_id=[2]
        )[0, len(prompt) :]
    assert sampled.tolist() == [pad] * 4  # the model really generated pad tokens
    ((c,),) = backend.generate([prompt], greedy(max_new_tokens=4))
    assert c.token_ids.tolist() == [pad] * 4
    assert c.finish_reason == "length"


def test_shared_prefill_samples_what_num_return_sequences_samples(backend, tiny_model_dir):
    """Prefilling each prompt once and repeating its cache draws the same tokens, with the same
    log-probs, as ``generate(num_return_sequences=n)`` over left-padded prompts of different
    lengths (same seed: the same random draws)."""
    params = sampling_params(n=5, temperature=0.9, max_new_tokens=10)
    torch.manual_seed(7)
    ours = backend.generate(PROMPTS, params)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    input_ids, attention = backend._left_pad(PROMPTS)
    torch.manual_seed(7)
    with torch.no_grad():
        plain = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=10,
            num_return_sequences=5,
            do_sample=True,
            temperature=0.9,
            top_p=1.0,
            top_k=0,
            pad_token_id=backend.pad_id,
            eos_token_id=sorted(backend.eos_ids),
        )
    width = input_ids.shape[1]
    for i, group in enumerate(ours):
        for j, c in enumerate(group):
            expected = plain[i * 5 + j, width:][: c.token_ids.numel()]
            assert c.token_ids.tolist() == expected.tolist()
            want = reference_logprobs(model, PROMPTS[i], c.token_ids, 0.9)
            torch.testing.assert_close(c.logprobs, want, rtol=1e-4, atol=1e-4)
