"""``rollout.exact_logprobs``: the producer's behaviour log-probs equal the trainer's, to the
bit, on CPU in float32 and under bfloat16 compute, over a few demo-shaped steps (the demo's
settings: float32 inference, G = 8 samples of up to 32 tokens, weights published after every
step); without it the same steps show the mismatch it removes."""

from __future__ import annotations

import pytest
import torch
from role_settings import run_config
from test_train_step_offpolicy import _Tok
from transformers import AutoModelForCausalLM

from zbrl.assembly.models import build_trainer
from zbrl.assembly.settings import producer_settings, step_settings
from zbrl.config import load_config
from zbrl.rollout.backends.transformers.backend import TransformersBackend
from zbrl.types import RolloutGroup

G = 8
PROMPTS = [[5, 17, 23, 9], [8, 12, 40, 41, 42]]


def demo_config(dtype, exact):
    return run_config(
        f"model.dtype={dtype}",
        "rollout.inference_dtype=float32",
        f"rollout.exact_logprobs={str(exact).lower()}",
        "rollout.generation.num_generations=8",
        "rollout.generation.max_new_tokens=10",
        "training.train_batch_size=2",
        "training.train_microbatch_size=16",
        "algorithm.lr=1e-3",
        "algorithm.beta=0",
    )


def run_steps(model_dir, dtype, *, exact, steps=2):
    """Generate → (re-score) → train → publish, ``steps`` times; each step's metrics."""
    from zbrl.embedded.tokenizer import build_tokenizer

    cfg = demo_config(dtype, exact)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    backend = TransformersBackend(model, build_tokenizer(), device="cpu")
    trainer = build_trainer(cfg, model_dir, _Tok(), total_steps=steps)
    settings = producer_settings(cfg, 0)
    params = settings.sampling
    out = []
    for step in range(steps):
        comps = backend.generate(PROMPTS, params)
        groups = []
        for prompt, group in zip(PROMPTS, comps, strict=True):
            logprobs = [c.logprobs for c in group]
            if settings.exact_logprobs is not None:
                logprobs = backend.score_exact(
                    [(prompt, c.token_ids) for c in group],
                    temperature=params.temperature,
                    dtype=getattr(torch, settings.exact_logprobs.dtype),
                    chunk_size=settings.exact_logprobs.chunk_size,
                )
            groups.append(
                RolloutGroup(
                    uid=f"p{len(groups)}@e{step}",
                    prompt_ids=prompt,
                    response_ids=[c.token_ids for c in group],
                    behaviour_logprobs=logprobs,
                    rewards=[float(i % 2) for i in range(G)],
                    format_acc=[1.0] * G,
                    ans_acc=[float(i % 2) for i in range(G)],
                    truncated=[False] * G,
                    policy_version=step,
                    temperature=params.temperature,
                    producer=0,
                )
            )
        out.append(trainer.train(groups, policy_version=step))
        weights = trainer.engine.full_state_dict()
        backend.load_weights({k: v.to(torch.float32) for k, v in weights.items()})
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_exact_logprobs_leave_no_mismatch(tiny_model_dir, dtype):
    for metrics in run_steps(tiny_model_dir, dtype, exact=True):
        assert metrics["mismatch_abs_logp"] == 0.0
        assert metrics["mismatch_ratio_max"] == 1.0


@pytest.mark.parametrize(("dtype", "above"), [("float32", 0.0), ("bfloat16", 1e-4)])
def test_without_exact_logprobs_the_same_steps_see_a_mismatch(tiny_model_dir, dtype, above):
    (metrics,) = run_steps(tiny_model_dir, dtype, exact=False, steps=1)
    assert metrics["mismatch_abs_logp"] > above


def test_exact_logprobs_train_one_group_of_full_rows_per_forward():
    cfg = demo_config("bfloat16", True)
    micro = step_settings(cfg, 0).micro
    assert (micro.size, micro.tokens, micro.share_prompts, micro.packing) == (G, None, False, False)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.backend.type=vllm"], "not the trainer's"),
        (["model.dtype=bfloat16"], "inference_dtype=float32"),
        (["training.packing=true"], "training.packing=false"),
        (["rollout.inflight_updates.enabled=true"], "inflight_updates.enabled=false"),
    ],
)
def test_exact_logprobs_refuse_what_breaks_equality(overrides, message):
    with pytest.raises(Exception, match=message):
        load_config(None, ["rollout.exact_logprobs=true", *overrides])
