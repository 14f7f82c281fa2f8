"""LoRA on the vLLM backend on a CUDA GPU (the ``vllm`` extra), embedded model: both
``lora_mode`` values give the log-probs of a transformers forward pass on the same GPU with the
adapters merged, and a second version replaces the first. Skipped without CUDA or vLLM.
UNVERIFIED: written without a GPU (docs/backends.md). vLLM's GPU LoRA kernels (Triton) may
compute in TF32, hence the looser tolerance for ``adapters``."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers.backends import max_logprob_error, random_lora_adapters, sampling, vllm_settings
from zbrl.config.model import LLAMA_LINEAR_LAYERS
from zbrl.models.lora import AdapterMerger
from zbrl.rollout.backends.vllm.lora import AdapterSpec, MergedAdapters

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25]]
RANK, ALPHA = 4, 8.0
TOLERANCE = {"adapters": 1e-3, "merged": 1e-4}


def base_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def random_adapters(model, seed):
    return random_lora_adapters(model, RANK, seed, LLAMA_LINEAR_LAYERS)


def merged(model_dir, adapters):
    model = base_model(model_dir)
    AdapterMerger(model, ALPHA / RANK).apply(adapters)
    return model.cuda()


@pytest.fixture(scope="module", params=["adapters", "merged"])
def engine(request, tiny_model_dir):
    from zbrl.rollout.backends.vllm.backend import VllmBackend

    spec = AdapterSpec(RANK, ALPHA, LLAMA_LINEAR_LAYERS, str(tiny_model_dir), False)
    lora = spec
    if request.param == "merged":
        lora = MergedAdapters(AdapterMerger(base_model(tiny_model_dir), ALPHA / RANK), spec)
    settings = vllm_settings(gpu_memory_utilization=0.3)
    backend = VllmBackend(tiny_model_dir, tiny_model_dir, settings, lora=lora)
    yield request.param, backend
    del backend
    torch.cuda.empty_cache()


def test_versions_match_the_merged_model_on_gpu(engine, tiny_model_dir):
    mode, backend = engine
    base = base_model(tiny_model_dir)
    v1, v2 = random_adapters(base, seed=1), random_adapters(base, seed=2)
    params = sampling(n=4, temperature=1.0, max_new_tokens=16)
    backend.load_weights(v1)
    out = backend.generate(PROMPTS, params)
    assert max_logprob_error(merged(tiny_model_dir, v1), PROMPTS, out, 1.0) < TOLERANCE[mode]
    backend.load_weights(v2)
    out = backend.generate(PROMPTS, params)
    assert max_logprob_error(merged(tiny_model_dir, v2), PROMPTS, out, 1.0) < TOLERANCE[mode]
    assert max_logprob_error(merged(tiny_model_dir, v1), PROMPTS, out, 1.0) > 0.01
