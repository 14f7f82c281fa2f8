"""The vLLM backend on a CUDA GPU (the ``vllm`` extra) with the embedded model: sampled log-probs
against a transformers forward pass on the same GPU, and an in-place weight update. Skipped
without CUDA or without vLLM. UNVERIFIED: written without a GPU (see docs/backends.md)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers.backends import max_logprob_error, sampling, vllm_settings

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25]]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from zbrl.rollout.backends.vllm.backend import VllmBackend

    settings = vllm_settings(gpu_memory_utilization=0.3)
    return VllmBackend(tiny_model_dir, tiny_model_dir, settings)


def test_logprobs_match_transformers_on_gpu(engine, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda()
    out = engine.generate(PROMPTS, sampling(n=4, temperature=0.7, max_new_tokens=16))
    assert [len(g) for g in out] == [4, 4, 4]
    assert max_logprob_error(model.eval(), PROMPTS, out, 0.7) < TOLERANCE


def test_in_place_update_follows_new_weights_on_gpu(engine, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    engine.load_weights(model.state_dict())
    out = engine.generate(PROMPTS, sampling(n=4, temperature=1.0, max_new_tokens=16))
    assert max_logprob_error(model.cuda().eval(), PROMPTS, out, 1.0) < TOLERANCE
