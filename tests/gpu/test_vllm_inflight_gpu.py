"""In-flight weight updates on the vLLM backend on a CUDA GPU (the ``vllm`` extra) with the
embedded model: the engine steps synchronously (vLLM's GPU default schedules asynchronously), and
after a swap with ``recompute`` each token's log-prob is the one of the version it is tagged with.
Skipped without CUDA or without vLLM. UNVERIFIED: written without a GPU (vLLM's CUDA build cannot
travel to the GPU machines this project may use; see docs/backends.md)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers.backends import vllm_settings
from zbrl.rollout.backends.base import SamplingParams
from zbrl.rollout.inflight import InflightSwap, generate_inflight

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 12], [1, 30], [1, 50, 51, 52, 25]]
TOLERANCE = 1e-4
CHUNK = 4


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from zbrl.rollout.backends.vllm.backend import VllmBackend

    settings = vllm_settings(gpu_memory_utilization=0.3, inflight_updates=True)
    return VllmBackend(tiny_model_dir, tiny_model_dir, settings)


def reference(model, prompt, response):
    ids = torch.tensor([list(prompt) + response.tolist()], device="cuda")
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    steps = logits[len(prompt) - 1 : len(prompt) - 1 + response.numel()]
    return torch.log_softmax(steps, -1).gather(1, response.cuda().view(-1, 1))[:, 0].cpu()


def test_inflight_engine_steps_synchronously_on_gpu(engine):
    assert not engine.llm.llm_engine.vllm_config.scheduler_config.async_scheduling


def test_a_swap_on_gpu_gives_each_token_its_versions_logprob(engine, tiny_model_dir):
    old = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(11)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    calls = []

    def swap():
        calls.append(None)
        if len(calls) == 2:
            engine.load_weights(new.state_dict())
        return 0 if len(calls) < 2 else 1

    params = SamplingParams(
        n=4, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=24, stop_strings=()
    )
    out = generate_inflight(engine, PROMPTS, params, InflightSwap(CHUNK, swap))
    old, new = old.cuda().eval(), new.cuda().eval()
    spans = 0
    for prompt, group in zip(PROMPTS, out):
        for c in group:
            before = c.versions == 0
            assert before.tolist() == [j < CHUNK for j in range(c.token_ids.numel())]
            spans += int((~before).any())
            err_old = (c.logprobs - reference(old, prompt, c.token_ids))[before].abs()
            assert float(err_old.max()) < TOLERANCE
            if (~before).any():
                err_new = (c.logprobs - reference(new, prompt, c.token_ids))[~before].abs()
                assert float(err_new.max()) < TOLERANCE
    assert spans >= 1
    engine.load_weights(old.cpu().state_dict())
