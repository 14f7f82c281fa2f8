"""The train step with an off-policy correction, GSPO, ppo_epochs and PPO's critic, on the embedded
tiny model: what each step computes (proximal pass, GAE, value loss) and that every path trains."""

from __future__ import annotations

import pytest
import torch
from role_settings import run_config, step_settings
from test_consumer import make_group
from transformers import AutoModelForCausalLM

from zbrl.assembly.models import build_engine, build_trainer
from zbrl.assembly.settings import loss_config
from zbrl.training.engine.single import SingleProcessEngine
from zbrl.training.rows import build_rows
from zbrl.training.train_step import Trainer


def trainer_for(model_dir, *overrides, lr=1e-3):
    cfg = run_config(*overrides, f"algorithm.lr={lr}", "training.train_microbatch_size=4")
    return build_trainer(cfg, model_dir, _Tok(), total_steps=10)


class _Tok:
    pad_token_id = 0


def groups(n=2, version=0):
    return [make_group(seed, version=version) for seed in range(n)]


@pytest.mark.parametrize(
    "overrides",
    [
        ("algorithm.correction=decoupled",),
        ("algorithm.correction=decoupled", "algorithm.proximal=loglinear"),
        ("algorithm.correction=decoupled", "algorithm.correction_level=sequence"),
        ("algorithm.correction=tis", "algorithm.correction_level=geometric"),
        ("algorithm.correction=mis",),
        ("algorithm.preset=gspo", "algorithm.correction=decoupled"),
        ("algorithm.ppo_epochs=2", "training.train_minibatch_size=1"),
        ("algorithm.preset=ppo",),
        ("algorithm.preset=ppo", "algorithm.beta=0.05", "algorithm.advantage.kl_in_reward=true"),
    ],
)
def test_every_path_trains_and_reports_its_metrics(tiny_model_dir, overrides):
    trainer = trainer_for(tiny_model_dir, *overrides)
    before = {k: v.clone() for k, v in trainer.engine.policy.state_dict().items()}
    metrics = trainer.train(groups(version=0), policy_version=2)
    after = trainer.engine.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
    for key in ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl"):
        assert key in metrics
    cfg = trainer.settings
    if cfg.loss.correction == "decoupled":
        assert {"is_weight_mean", "is_weight_max", "is_capped_frac", "behav_prox_k3"} <= set(
            metrics
        )
    if cfg.loss.correction == "mis":
        assert "is_masked_frac" in metrics
    if cfg.critic is not None:
        assert {"value_loss", "explained_variance", "critic_grad_norm"} <= set(metrics)
    expected_steps = 2 if "algorithm.ppo_epochs=2" in overrides else 1
    expected_steps *= 2 if "training.train_minibatch_size=1" in overrides else 1
    assert trainer.engine.optimizer_steps == expected_steps


def test_recomputed_proximal_is_the_step_start_policy(tiny_model_dir):
    """The proximal log-probs equal the policy's at the step start (the behaviour log-probs of
    the stub groups are far from it), so behav_prox_k3 > 0 and, at the first micro-batch of the
    first mini-batch, the ratio to the proximal policy is 1."""
    trainer = trainer_for(tiny_model_dir, "algorithm.correction=decoupled")
    seen = []
    original = trainer._micro_step

    def spy(mb, norm, steps):
        seen.append(mb.proximal_logprobs_BT.clone())
        return original(mb, norm, steps)

    trainer._micro_step = spy
    metrics = trainer.train(groups(), policy_version=1)
    assert metrics["behav_prox_k3"] > 1e-3
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == 0.0
    assert seen and all(p is not None for p in seen)


def test_decoupled_with_behaviour_equal_proximal_is_plain_ppo(tiny_model_dir):
    """When the behaviour log-probs are the step-start policy's own, decoupled trains exactly
    like no correction."""
    trainers = [
        trainer_for(tiny_model_dir, "algorithm.correction=decoupled"),
        trainer_for(tiny_model_dir),
    ]
    batch = groups()
    probe = trainers[0]
    rows = build_rows(batch, torch.zeros(2, 4), filter_truncated=False, loss_filter_range=None)
    from zbrl.training.step_start import annotate_step_start

    annotate_step_start(
        probe.engine,
        rows,
        lambda lg, tg, tp: probe._logprobs(lg, tg, tp)[0],
        batching=probe.settings.micro,  # the trainers' own layout: bit-equal log-probs
        pad_id=0,
        proximal=True,
        reference=False,
        values=False,
    )
    for group_index, group in enumerate(batch):
        for g in range(group.group_size):
            group.behaviour_logprobs[g] = rows[group_index * 4 + g].proximal_logprobs.clone()
    results = [t.train(batch, policy_version=0) for t in trainers]
    for name, param in trainers[0].engine.policy.named_parameters():
        other = dict(trainers[1].engine.policy.named_parameters())[name]
        torch.testing.assert_close(param, other, rtol=0, atol=1e-6)
    assert results[0]["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], abs=1e-6)


def test_ppo_critic_learns_the_returns(tiny_model_dir):
    """Repeated steps on one batch: the critic's value loss falls and its explained variance
    rises (the rewards are fixed per sequence)."""
    trainer = trainer_for(tiny_model_dir, "algorithm.preset=ppo", "algorithm.critic.lr=3e-3")
    batch = groups()
    first = trainer.train(batch, policy_version=0)
    for _ in range(15):
        last = trainer.train(batch, policy_version=0)
    assert last["value_loss"] < 0.5 * first["value_loss"]
    assert last["explained_variance"] > first["explained_variance"]
    state = trainer.engine.state_dict()
    assert "critic" in state and "critic_optimizer" in state


def test_critic_state_round_trips(tiny_model_dir):
    cfg = run_config("algorithm.preset=ppo")
    engine = build_engine(cfg, tiny_model_dir, total_steps=3)
    trainer = Trainer(engine, step_settings("algorithm.preset=ppo", microbatch_size=4))
    trainer.train(groups(), policy_version=0)
    state = engine.state_dict()
    fresh = build_engine(cfg, tiny_model_dir, total_steps=3)
    fresh.load_state_dict(state)
    for (name, a), (_, b) in zip(
        engine.critic.state_dict().items(), fresh.critic.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    plain = build_engine(run_config(), tiny_model_dir, total_steps=3)
    with pytest.raises(ValueError, match="critic"):
        plain.load_state_dict(state)


def test_trainer_refuses_mismatched_critic(tiny_model_dir):
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    opt = torch.optim.AdamW(policy.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(ValueError, match="critic"):
        Trainer(SingleProcessEngine(policy, opt, sched), step_settings("algorithm.preset=ppo"))
    assert loss_config(run_config("algorithm.preset=gspo")).clip_eps_high == 4e-4


def test_one_update_per_batch_decoupled_and_tis_take_the_same_step(tiny_model_dir):
    """With one optimizer step per batch the updated policy *is* the proximal one, so decoupled's
    gradient min(π_prox/π_behav, C)·A·∇log π equals TIS's min(π/π_behav, C)·A·∇log π."""
    trainers = [
        trainer_for(tiny_model_dir, "algorithm.correction=decoupled"),
        trainer_for(tiny_model_dir, "algorithm.correction=tis"),
    ]
    batch = groups()
    for group in batch:  # behaviour log-probs spread around the policy's: weights on both sides
        gen = torch.Generator().manual_seed(len(group.prompt_ids))
        group.behaviour_logprobs = [
            lp + 0.5 * torch.randn(lp.shape, generator=gen) for lp in group.behaviour_logprobs
        ]
    results = [t.train(batch, policy_version=3) for t in trainers]
    params = [dict(t.engine.policy.named_parameters()) for t in trainers]
    for name, param in params[0].items():
        torch.testing.assert_close(param, params[1][name], rtol=0, atol=1e-5)  # Adam: lr 1e-3
    assert results[0]["grad_norm"] == pytest.approx(results[1]["grad_norm"], rel=1e-4)
