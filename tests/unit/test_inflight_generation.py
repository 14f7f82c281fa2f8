"""Chunked generation with weight swaps between chunks (in-flight updates) on the embedded tiny
model: without a new version it is the unchunked sampler, token for token and log-prob for
log-prob; with one, the tokens carry two versions and each token's log-prob is its own weights'
(checked against a fresh forward pass of each weight set)."""

import copy

import pytest
import torch
from role_settings import sampling_params
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.backends import reference_logprobs as forward_logprobs
from zbrl.rollout.backends.transformers.backend import TransformersBackend
from zbrl.rollout.inflight import InflightSwap, generate_inflight

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25]]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def backend(tiny_model_dir, tokenizer):
    return TransformersBackend(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)


def fixed(version):
    return InflightSwap(chunk_tokens=3, swap=lambda: version)


def flat(groups):
    return [c for group in groups for c in group]


def assert_same(chunked, plain):
    assert len(chunked) == len(plain)
    for a, b in zip(chunked, plain, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.finish_reason == b.finish_reason and a.text == b.text
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 4, "temperature": 1.0},
        {"n": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 20},
        {"n": 2, "temperature": 0.0},
    ],
)
def test_chunks_without_a_new_version_equal_the_unchunked_sampler(backend, fields):
    params = sampling_params(max_new_tokens=11, **fields)
    torch.manual_seed(5)
    plain = flat(backend.generate(PROMPTS, params))
    torch.manual_seed(5)
    chunked = flat(generate_inflight(backend, PROMPTS, params, fixed(7)))
    assert_same(chunked, plain)
    assert all(
        c.versions is not None and c.versions.tolist() == [7] * len(c.token_ids) for c in chunked
    )
    assert all(c.versions is None for c in plain)


def safe_stops(tokenizer, probe):
    """Short strings the model samples that no token holds anywhere but at its end (there the
    unchunked path's stop check and transformers' stop-string rule agree)."""
    vocab = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    seen = {tokenizer.decode([int(t)]) for c in probe for t in c.token_ids[:4]}

    def safe(s):
        return all(t.endswith(s) and t.count(s) == 1 for t in vocab if s in t)

    return tuple(sorted(s for s in seen if s.strip() and safe(s))[:4])


def test_chunks_honour_eos_and_stop_strings_like_the_unchunked_sampler(backend, tokenizer):
    torch.manual_seed(0)
    probe = flat(
        backend.generate(PROMPTS, sampling_params(n=6, temperature=1.0, max_new_tokens=12))
    )
    stops = safe_stops(tokenizer, probe)
    assert len(stops) >= 2
    params = sampling_params(n=6, temperature=1.0, max_new_tokens=12, stop_strings=stops)
    reasons = set()
    for seed in range(3):
        torch.manual_seed(seed)
        plain = flat(backend.generate(PROMPTS, params))
        torch.manual_seed(seed)
        chunked = flat(generate_inflight(backend, PROMPTS, params, fixed(0)))
        assert_same(chunked, plain)
        reasons |= {(c.finish_reason, c.text.endswith(stops)) for c in plain}
    assert {("stop", True), ("length", False)} <= reasons  # stop strings did end some


def test_a_stop_string_inside_a_token_ends_the_chunked_response_where_generate_ends_it(
    backend, tokenizer
):
    closing = next(i for i in range(len(tokenizer)) if tokenizer.decode([i]) == "</answer>")
    params = sampling_params(n=8, temperature=1.0, max_new_tokens=12, stop_strings=("/",))
    torch.manual_seed(0)
    out = flat(generate_inflight(backend, PROMPTS, params, fixed(0)))
    ended_inside = [c for c in out if closing in c.token_ids.tolist()]
    assert ended_inside  # "/" matched inside the "</answer>" token...
    for c in ended_inside:  # ...and the response ends on that token, no padding after it
        assert c.token_ids.tolist().index(closing) == c.token_ids.numel() - 1
        assert c.finish_reason == "stop"


def test_a_swap_mid_generation_gives_two_versions_each_with_its_own_logprobs(backend):
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

    params = sampling_params(n=2, temperature=0.8, max_new_tokens=12)
    torch.manual_seed(1)
    out = flat(generate_inflight(backend, PROMPTS, params, InflightSwap(4, swap)))
    spanning = 0
    for c, prompt in zip(out, [p for p in PROMPTS for _ in range(2)], strict=True):
        n = c.token_ids.numel()
        assert c.versions.tolist() == ([4] * 8 + [5] * 4)[:n]
        old = forward_logprobs(old_model, prompt, c.token_ids, 0.8)
        new = forward_logprobs(new_model, prompt, c.token_ids, 0.8)
        torch.testing.assert_close(c.logprobs[:8], old[:8], atol=1e-4, rtol=0)
        if n > 8:
            spanning += 1
            torch.testing.assert_close(c.logprobs[8:], new[8:], atol=1e-4, rtol=0)
            assert (c.logprobs[8:] - old[8:]).abs().max() > 1e-3  # the weights did change
    assert spanning >= 2


def test_keeping_the_cache_samples_the_new_weights_over_the_old_keys_and_values(
    backend, monkeypatch
):
    """``keep_cache``: no recompute after the swap; the tokens before it are the old weights'
    (with their log-probs), those after it carry the new version and log-probs that neither
    weight set gives on its own (new weights over the old keys and values)."""
    from zbrl.rollout.backends.transformers.inflight import ChunkedGeneration

    def no_recompute(*args):
        raise AssertionError("the cache was recomputed")

    monkeypatch.setattr(ChunkedGeneration, "_after_swap", no_recompute)
    old_model = copy.deepcopy(backend.model)
    torch.manual_seed(3)
    new_weights = {k: v + 0.05 * torch.randn_like(v) for k, v in backend.model.state_dict().items()}
    new_model = copy.deepcopy(backend.model)
    new_model.load_state_dict(new_weights)
    calls = []

    def swap():
        calls.append(1)
        if len(calls) == 3:
            backend.load_weights(new_weights)
        return 4 if len(calls) < 3 else 5

    params = sampling_params(n=2, temperature=0.8, max_new_tokens=12)
    torch.manual_seed(1)
    out = flat(generate_inflight(backend, PROMPTS, params, InflightSwap(4, swap, keep_cache=True)))
    mixed = 0
    for c, prompt in zip(out, [p for p in PROMPTS for _ in range(2)], strict=True):
        assert c.versions.tolist() == ([4] * 8 + [5] * 4)[: c.token_ids.numel()]
        old = forward_logprobs(old_model, prompt, c.token_ids, 0.8)
        torch.testing.assert_close(c.logprobs[:8], old[:8], atol=1e-4, rtol=0)
        if c.token_ids.numel() > 8:
            new = forward_logprobs(new_model, prompt, c.token_ids, 0.8)
            assert (c.logprobs[8:] - new[8:]).abs().max() > 1e-4
            assert (c.logprobs[8:] - old[8:]).abs().max() > 1e-4
            mixed += 1
    assert mixed >= 2


def test_greedy_copies_carry_their_versions(backend):
    out = generate_inflight(
        backend, PROMPTS[:1], sampling_params(n=3, temperature=0.0, max_new_tokens=5), fixed(2)
    )
    assert [c.versions.tolist() for c in out[0]] == [[2] * out[0][0].token_ids.numel()] * 3
    out[0][0].versions[0] = 9
    assert out[0][1].versions[0] == 2  # copies, not views


def test_inflight_updates_are_refused_where_they_do_not_apply():
    from zbrl.config import ConfigError, load_config

    on = "rollout.inflight_updates.enabled=true"
    assert not load_config(None, []).rollout.inflight_updates.enabled  # off by default
    load_config(None, [on])
    load_config(None, [on, "rollout.backend=vllm"])
    for mode in ("merged", "adapters"):  # LoRA on vLLM either way
        load_config(
            None, [on, f"rollout.backend={{type: vllm, lora_mode: {mode}}}", "model.lora.rank=4"]
        )
    with pytest.raises(ConfigError, match=r"rollout\.inflight_updates\.enabled=true") as info:
        load_config(None, [on, "environment=tools"])
    assert "rollout.inflight_updates.enabled=false" in str(info.value)


def test_weights_loaded_at_the_start_are_the_ones_the_shared_prefill_uses(backend):
    torch.manual_seed(4)
    new_weights = {k: v + 0.05 * torch.randn_like(v) for k, v in backend.model.state_dict().items()}
    reference = copy.deepcopy(backend.model)
    reference.load_state_dict(new_weights)

    def swap():  # a newer version is ready when the generation starts
        if not swap.loaded:
            backend.load_weights(new_weights)
            swap.loaded = True
        return 9

    swap.loaded = False
    params = sampling_params(n=3, temperature=1.0, max_new_tokens=6)  # n > 1: shared prefill
    out = generate_inflight(backend, PROMPTS, params, InflightSwap(4, swap))
    for prompt, group in zip(PROMPTS, out, strict=True):
        for c in group:
            assert c.versions.tolist() == [9] * c.token_ids.numel()
            ref = forward_logprobs(reference, prompt, c.token_ids, 1.0)
            torch.testing.assert_close(c.logprobs, ref, atol=1e-4, rtol=0)
