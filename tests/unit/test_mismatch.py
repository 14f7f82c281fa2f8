"""Behaviour/trainer mismatch metrics against a loop over tokens."""

import math

import pytest
import torch

from zbrl.algorithms.mismatch import mismatch_metrics


def _loop_reference(trainer, behaviour, mask):
    deltas = [
        float(trainer[b, t]) - float(behaviour[b, t])
        for b in range(trainer.shape[0])
        for t in range(trainer.shape[1])
        if mask[b, t]
    ]
    return {
        "mismatch_abs_logp": sum(abs(d) for d in deltas) / len(deltas),
        "mismatch_k3": sum(math.exp(d) - 1 - d for d in deltas) / len(deltas),
        "mismatch_ratio_max": max(math.exp(d) for d in deltas),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference(seed):
    g = torch.Generator().manual_seed(seed)
    behaviour = -torch.rand(4, 9, generator=g) * 3
    trainer = behaviour + torch.randn(4, 9, generator=g) * 0.3
    mask = torch.rand(4, 9, generator=g) > 0.3
    # padding positions hold garbage that must not count
    trainer[~mask] = 50.0
    got = mismatch_metrics(trainer, behaviour, mask.long())
    want = _loop_reference(trainer, behaviour, mask)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_equal_logprobs_give_zero_mismatch_and_ratio_one():
    lp = -torch.rand(2, 5)
    got = mismatch_metrics(lp, lp.clone(), torch.ones(2, 5))
    assert got == {"mismatch_abs_logp": 0.0, "mismatch_k3": 0.0, "mismatch_ratio_max": 1.0}


def test_empty_mask_and_shape_errors():
    lp = torch.zeros(2, 3)
    assert mismatch_metrics(lp, lp, torch.zeros(2, 3))["mismatch_k3"] == 0.0
    with pytest.raises(ValueError, match="shapes"):
        mismatch_metrics(lp, torch.zeros(2, 4), torch.ones(2, 3))


def _true_logprobs(model, group):
    out = []
    for resp in group.response_ids:
        ids = torch.tensor([[*group.prompt_ids, *resp.tolist()]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
        targets = ids[0, 1:]
        out.append(logp.gather(1, targets[:, None])[:, 0][-len(resp) :])
    return out


@pytest.mark.parametrize("shift", [0.0, 0.1])
def test_train_step_reports_mismatch_of_its_recomputation(tiny_model_dir, shift):
    """Behaviour log-probs equal to the trainer's (shifted by ``shift``) give a mismatch of 0
    (of exactly ``shift``) in the step metrics."""
    from test_consumer import make_group, make_trainer

    trainer = make_trainer(tiny_model_dir, microbatch_size=8)
    group = make_group(1, rewards=(1.0,) * 4)
    group.behaviour_logprobs = [lp + shift for lp in _true_logprobs(trainer.engine.policy, group)]
    metrics = trainer.train([group])
    assert metrics["mismatch_abs_logp"] == pytest.approx(shift, abs=1e-5)
    assert metrics["mismatch_k3"] == pytest.approx(math.expm1(-shift) + shift, abs=1e-6)
    assert metrics["mismatch_ratio_max"] == pytest.approx(math.exp(-shift), abs=1e-5)
