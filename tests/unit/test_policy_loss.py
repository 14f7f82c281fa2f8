"""PPO clipped loss and KL estimators against plain-Python loop references, plus edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from zbrl.algorithms import (
    AGGREGATION_MODES,
    POLICY_LOSSES,
    LossConfig,
    LossInputs,
    Normalisers,
    compute_policy_loss,
    kl_estimate,
    normalisers_for,
)
from zbrl.config import ConfigError, load_config

# ---------------------------------------------------------------- loop references (python floats)


def ref_kl(logp: float, ref: float, kind: str) -> float:
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref) ** 2
    log_ratio = ref - logp
    return math.exp(log_ratio) - log_ratio - 1.0


def ref_token_loss(logp, old, adv, ref, ent, cfg: LossConfig) -> tuple[float, float]:
    """(total per-token loss, clipped surrogate) for one token."""
    ratio = math.exp(logp - old)
    clipped = min(max(ratio, 1.0 - cfg.clip_eps_low), 1.0 + cfg.clip_eps_high)
    pg = -min(ratio * adv, clipped * adv)
    if cfg.dual_clip_c is not None and adv < 0:
        pg = min(pg, -cfg.dual_clip_c * adv)
    total = pg
    if cfg.beta > 0:
        total += cfg.beta * ref_kl(logp, ref, cfg.kl_estimator)
    if cfg.entropy_coef > 0:
        total -= cfg.entropy_coef * ent
    return total, pg


def ref_aggregate(loss: list[list[float]], mask: list[list[int]], mode: str, norm) -> float:
    total = 0.0
    for row_loss, row_mask in zip(loss, mask, strict=True):
        seq_sum = sum(value for value, m in zip(row_loss, row_mask, strict=True) if m)
        seq_len = sum(row_mask)
        if mode == "seq-mean-token-mean":
            total += seq_sum / seq_len if seq_len > 0 else 0.0
        else:
            total += seq_sum
    if mode == "token-mean":
        return total / norm.tokens
    if mode == "seq-mean-token-sum-norm":
        return total / (norm.seqs * norm.norm_tokens)
    return total / norm.seqs


def ref_ppo_loss(inputs: LossInputs, cfg: LossConfig, norm: Normalisers) -> float:
    logp = inputs.logprobs_BT.tolist()
    old = inputs.old_logprobs_BT.tolist()
    mask = inputs.mask_BT.int().tolist()
    adv = inputs.advantages_B_or_BT.tolist()
    ref = inputs.ref_logprobs_BT.tolist() if inputs.ref_logprobs_BT is not None else None
    ent = inputs.entropy_BT.tolist() if inputs.entropy_BT is not None else None
    per_token = []
    for b in range(len(logp)):
        row = []
        for t in range(len(logp[b])):
            a = adv[b][t] if isinstance(adv[b], list) else adv[b]
            r = ref[b][t] if ref is not None else 0.0
            e = ent[b][t] if ent is not None else 0.0
            row.append(ref_token_loss(logp[b][t], old[b][t], a, r, e, cfg)[0])
        per_token.append(row)
    return ref_aggregate(per_token, mask, cfg.aggregation, norm)


def random_inputs(seed: int, per_token_adv: bool = False) -> LossInputs:
    gen = torch.Generator().manual_seed(seed)
    batch, length = 5, 9
    old = -torch.rand(batch, length, generator=gen) * 4.0
    logp = old + torch.randn(batch, length, generator=gen) * 0.4  # ratios well outside the clip
    ref = old + torch.randn(batch, length, generator=gen) * 0.3
    entropy = torch.rand(batch, length, generator=gen) * 2.0
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0] = 0  # always one empty sequence
    lengths[1] = length
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    shape = (batch, length) if per_token_adv else (batch,)
    adv = torch.randn(*shape, generator=gen)
    return LossInputs(
        logprobs_BT=logp.requires_grad_(True),
        old_logprobs_BT=old,
        advantages_B_or_BT=adv,
        mask_BT=mask,
        ref_logprobs_BT=ref,
        entropy_BT=entropy,
    )


CONFIGS = [
    LossConfig(),
    LossConfig(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip_c=3.0),
    LossConfig(beta=0.05, kl_estimator="k1", aggregation="seq-mean-token-mean"),
    LossConfig(beta=0.1, kl_estimator="k2", aggregation="seq-mean-token-sum"),
    LossConfig(beta=0.1, kl_estimator="k3", entropy_coef=0.01, dual_clip_c=1.5),
    LossConfig(clip_eps_low=0.1, clip_eps_high=0.3, aggregation="seq-mean-token-sum-norm"),
]


# ---------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("cfg_index", range(len(CONFIGS)))
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_ppo_clip_matches_loop_reference(seed: int, cfg_index: int, per_token_adv: bool) -> None:
    cfg = CONFIGS[cfg_index]
    inputs = random_inputs(seed, per_token_adv)
    norm = normalisers_for(inputs.mask_BT, norm_tokens=16.0)
    out = compute_policy_loss("ppo_clip", inputs, cfg, norm)
    assert out.loss.dim() == 0
    assert out.loss.item() == pytest.approx(ref_ppo_loss(inputs, cfg, norm), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_ppo_clip_gradient_matches_loop_reference(seed: int, mode: str) -> None:
    """d loss / d logp = -A·ρ / denominator where the unclipped branch is active, else 0."""
    cfg = LossConfig(clip_eps_low=0.2, clip_eps_high=0.25, aggregation=mode)
    inputs = random_inputs(seed)
    norm = normalisers_for(inputs.mask_BT, norm_tokens=16.0)
    compute_policy_loss("ppo_clip", inputs, cfg, norm).loss.backward()
    logp, old = inputs.logprobs_BT.tolist(), inputs.old_logprobs_BT.tolist()
    mask, adv = inputs.mask_BT.int().tolist(), inputs.advantages_B_or_BT.tolist()
    expected = []
    for b in range(len(logp)):
        seq_len = sum(mask[b])
        if mode == "token-mean":
            denominator = norm.tokens
        elif mode == "seq-mean-token-mean":
            denominator = norm.seqs * max(seq_len, 1)
        elif mode == "seq-mean-token-sum":
            denominator = norm.seqs
        else:
            denominator = norm.seqs * norm.norm_tokens
        row = []
        for t in range(len(logp[b])):
            ratio = math.exp(logp[b][t] - old[b][t])
            clipped_away = (adv[b] > 0 and ratio > 1 + cfg.clip_eps_high) or (
                adv[b] < 0 and ratio < 1 - cfg.clip_eps_low
            )
            active = mask[b][t] and not clipped_away
            row.append(-adv[b] * ratio / denominator if active else 0.0)
        expected.append(row)
    torch.testing.assert_close(
        inputs.logprobs_BT.grad, torch.tensor(expected), rtol=1e-5, atol=1e-7
    )


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
@pytest.mark.parametrize("seed", range(5))
def test_kl_estimators_match_reference(kind: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(4, 7, generator=gen) * 5.0
    ref = -torch.rand(4, 7, generator=gen) * 5.0
    got = kl_estimate(logp, ref, kind)
    want = [
        [ref_kl(a, b, kind) for a, b in zip(row_p, row_r, strict=True)]
        for row_p, row_r in zip(logp.tolist(), ref.tolist(), strict=True)
    ]
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_kl_estimator_properties() -> None:
    same = torch.tensor([[-1.0, -2.0]])
    for kind in ("k1", "k2", "k3"):
        assert torch.equal(kl_estimate(same, same, kind), torch.zeros(1, 2))
    # k2 and k3 are non-negative; k1 is not.
    logp, ref = torch.tensor([[-3.0, -0.1]]), torch.tensor([[-0.1, -3.0]])
    assert (kl_estimate(logp, ref, "k2") >= 0).all()
    assert (kl_estimate(logp, ref, "k3") >= 0).all()
    assert (kl_estimate(logp, ref, "k1") < 0).any()
    # k3 stays finite for absurd log-ratios (clamped at ±20) and is accurate for tiny ones.
    extreme = kl_estimate(torch.tensor([[-200.0]]), torch.tensor([[0.0]]), "k3")
    assert torch.isfinite(extreme).all()
    assert extreme.item() == pytest.approx(math.exp(20.0) - 21.0, rel=1e-5)
    tiny = kl_estimate(torch.tensor([[-1.0]]), torch.tensor([[-1.0 + 1e-3]]), "k3").item()
    assert tiny == pytest.approx(0.5e-6, rel=1e-2)  # ≈ x²/2; naive exp(x)-x-1 loses this
    with pytest.raises(ValueError, match="unknown KL estimator kind 'k4'"):
        kl_estimate(same, same, "k4")  # type: ignore[arg-type]


def extreme_inputs() -> LossInputs:
    # tokens: ratio 3 & A>0 (high clip), ratio 0.1 & A<0 (low clip), ratio 10 & A<0 (dual clip),
    # ratio 1 & A>0 (nothing), ratio 0.5 & A>0 (no clip: pessimistic branch), masked ratio 100.
    ratios = torch.tensor([[3.0, 0.1, 10.0, 1.0, 0.5, 100.0]])
    adv = torch.tensor([[1.0, -1.0, -2.0, 0.5, 1.0, -1.0]])
    old = torch.full((1, 6), -2.0)
    return LossInputs(
        logprobs_BT=(old + ratios.log()).requires_grad_(True),
        old_logprobs_BT=old,
        advantages_B_or_BT=adv,
        mask_BT=torch.tensor([[1, 1, 1, 1, 1, 0]]),
    )


def test_extreme_ratios_clip_fractions_and_values() -> None:
    inputs = extreme_inputs()
    cfg = LossConfig(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip_c=3.0)
    norm = normalisers_for(inputs.mask_BT)
    out = compute_policy_loss("ppo_clip", inputs, cfg, norm)
    # per-token pg: -1.2, 0.8*1=0.8, min(10*2, 3*2)=6, -0.5, -0.5
    assert out.loss.item() == pytest.approx((-1.2 + 0.8 + 6.0 - 0.5 - 0.5) / 5, rel=1e-5)
    m = out.metrics
    assert m["num_tokens"] == 5.0
    assert m["clip_frac_high"] == pytest.approx(1 / 5)
    assert m["clip_frac_low"] == pytest.approx(1 / 5)
    assert m["dual_clip_frac"] == pytest.approx(1 / 5)
    assert m["ratio_max"] == pytest.approx(10.0, rel=1e-5)  # the masked ratio 100 is ignored
    assert m["ratio_mean"] == pytest.approx((3.0 + 0.1 + 10.0 + 1.0 + 0.5) / 5, rel=1e-5)
    assert m["pg_loss"] == pytest.approx(out.loss.item(), rel=1e-5)
    approx_kl = sum(r - math.log(r) - 1 for r in (3.0, 0.1, 10.0, 1.0, 0.5)) / 5  # k3, ρ = π/π_old
    assert m["approx_kl"] == pytest.approx(approx_kl, rel=1e-5)
    assert "kl" not in m and "entropy" not in m
    assert all(isinstance(v, float) for v in m.values())
    out.loss.backward()
    grad = inputs.logprobs_BT.grad[0].tolist()
    # clipped and dual-clipped tokens get no gradient; the others -A·ρ/N.
    assert grad == pytest.approx([0.0, 0.0, 0.0, -0.5 / 5, -0.5 / 5, 0.0], abs=1e-7)


def test_without_dual_clip_negative_advantage_is_unbounded() -> None:
    inputs = extreme_inputs()
    out = compute_policy_loss("ppo_clip", inputs, LossConfig(), normalisers_for(inputs.mask_BT))
    assert out.loss.item() == pytest.approx((-1.2 + 0.8 + 20.0 - 0.5 - 0.5) / 5, rel=1e-5)
    assert out.metrics["dual_clip_frac"] == 0.0


def test_fully_masked_rows_give_zero_loss_and_zero_grad() -> None:
    inputs = random_inputs(0)
    inputs.mask_BT[2] = False
    # Garbage where the mask is 0 must not leak into the loss or the gradient.
    with torch.no_grad():
        inputs.logprobs_BT[2] = float("-inf")
    inputs.old_logprobs_BT[2] = float("-inf")
    inputs.ref_logprobs_BT[2] = float("nan")
    inputs.entropy_BT[2] = float("nan")
    cfg = LossConfig(beta=0.1, entropy_coef=0.01, dual_clip_c=3.0)
    out = compute_policy_loss("ppo_clip", inputs, cfg, normalisers_for(inputs.mask_BT))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert torch.equal(inputs.logprobs_BT.grad[0], torch.zeros(9))  # empty by construction
    assert torch.equal(inputs.logprobs_BT.grad[2], torch.zeros(9))
    assert all(math.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_all_masked_batch_is_zero_not_nan(mode: str) -> None:
    inputs = random_inputs(1)
    inputs.mask_BT.zero_()
    cfg = LossConfig(beta=0.1, entropy_coef=0.01, aggregation=mode)
    out = compute_policy_loss("ppo_clip", inputs, cfg, normalisers_for(inputs.mask_BT))
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(inputs.logprobs_BT.grad, torch.zeros_like(inputs.logprobs_BT))
    assert out.metrics["num_tokens"] == 0.0
    assert all(math.isfinite(v) for v in out.metrics.values())


def test_kl_and_entropy_metrics_and_terms() -> None:
    inputs = random_inputs(2)
    norm = normalisers_for(inputs.mask_BT)
    base = compute_policy_loss("ppo_clip", inputs, LossConfig(), norm)
    with_kl = compute_policy_loss("ppo_clip", inputs, LossConfig(beta=0.5), norm)
    with_ent = compute_policy_loss("ppo_clip", inputs, LossConfig(entropy_coef=0.5), norm)
    valid = inputs.mask_BT
    mean_kl = kl_estimate(inputs.logprobs_BT, inputs.ref_logprobs_BT, "k3")[valid].mean().item()
    mean_ent = inputs.entropy_BT[valid].mean().item()
    assert with_kl.metrics["kl"] == pytest.approx(mean_kl, rel=1e-5)
    assert with_kl.loss.item() == pytest.approx(base.loss.item() + 0.5 * mean_kl, rel=1e-5)
    assert with_ent.loss.item() == pytest.approx(base.loss.item() - 0.5 * mean_ent, rel=1e-5)
    assert base.metrics["entropy"] == pytest.approx(mean_ent, rel=1e-5)  # logged when given


def test_missing_reference_or_entropy_is_a_clear_error() -> None:
    inputs = random_inputs(0)
    inputs.ref_logprobs_BT = None
    inputs.entropy_BT = None
    norm = normalisers_for(inputs.mask_BT)
    with pytest.raises(ValueError, match=r"beta > 0 needs LossInputs.ref_logprobs_BT"):
        compute_policy_loss("ppo_clip", inputs, LossConfig(beta=0.1), norm)
    with pytest.raises(ValueError, match=r"entropy_coef > 0 needs LossInputs.entropy_BT"):
        compute_policy_loss("ppo_clip", inputs, LossConfig(entropy_coef=0.1), norm)


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        ("algorithm.policy_loss.dual_clip_c=0.5", r"policy_loss.dual_clip_c' = 0.5: .*above 1"),
        ("algorithm.loss_aggregation=mean", r"loss_aggregation' = 'mean'"),
        ("algorithm.kl_estimator=k9", r"kl_estimator' = 'k9'"),
    ],
)
def test_bad_loss_settings_are_refused_once_by_the_config(override: str, expect: str) -> None:
    """LossConfig's values are validated in one place, the run config (issue 13)."""
    with pytest.raises(ConfigError, match=expect):
        load_config(None, [override])


def test_loss_config_defaults_are_the_config_defaults() -> None:
    a = load_config(None, []).algorithm
    cfg = LossConfig()
    assert (cfg.clip_eps_low, cfg.clip_eps_high, cfg.dual_clip_c) == (
        a.policy_loss.clip_eps_low,
        a.policy_loss.clip_eps_high,
        a.policy_loss.dual_clip_c,
    )
    assert (cfg.beta, cfg.kl_estimator, cfg.entropy_coef, cfg.aggregation) == (
        a.beta,
        a.kl_estimator,
        a.entropy_coef,
        a.loss_aggregation,
    )


def test_bad_mode_and_shapes_are_clear_errors() -> None:
    inputs = random_inputs(0)
    norm = normalisers_for(inputs.mask_BT)
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'mean'"):
        compute_policy_loss("ppo_clip", inputs, LossConfig(aggregation="mean"), norm)
    with pytest.raises(ValueError, match="unknown KL estimator kind 'k9'"):
        compute_policy_loss("ppo_clip", inputs, LossConfig(beta=0.1, kl_estimator="k9"), norm)
    inputs.advantages_B_or_BT = torch.zeros(3)
    with pytest.raises(ValueError, match="advantages_B_or_BT has shape"):
        compute_policy_loss("ppo_clip", inputs, LossConfig(), normalisers_for(inputs.mask_BT))


def test_ratio_is_computed_in_float32_from_bf16_logprobs() -> None:
    inputs = random_inputs(3)
    bf16 = LossInputs(
        logprobs_BT=inputs.logprobs_BT.detach().bfloat16().requires_grad_(True),
        old_logprobs_BT=inputs.old_logprobs_BT.bfloat16(),
        advantages_B_or_BT=inputs.advantages_B_or_BT,
        mask_BT=inputs.mask_BT,
    )
    upcast = LossInputs(
        logprobs_BT=bf16.logprobs_BT.detach().float(),
        old_logprobs_BT=bf16.old_logprobs_BT.float(),
        advantages_B_or_BT=inputs.advantages_B_or_BT,
        mask_BT=inputs.mask_BT,
    )
    norm = normalisers_for(inputs.mask_BT)
    got = compute_policy_loss("ppo_clip", bf16, LossConfig(), norm)
    want = compute_policy_loss("ppo_clip", upcast, LossConfig(), norm)
    assert got.loss.dtype == torch.float32
    assert got.loss.item() == pytest.approx(want.loss.item(), rel=1e-6)


def test_registry_lookup() -> None:
    assert "ppo_clip" in POLICY_LOSSES
    assert POLICY_LOSSES.get("zbrl.algorithms.policy_loss:ppo_clip") is POLICY_LOSSES.get(
        "ppo_clip"
    )


# ------------------------------------------------ issue 14: KL masking and the approx_kl metric


def test_kl_penalty_issue_example_has_finite_gradient() -> None:
    """The reported case: k2, a NaN current log-prob at the masked position."""
    inputs = LossInputs(
        logprobs_BT=torch.tensor([[-1.0, float("nan")]], requires_grad=True),
        old_logprobs_BT=torch.tensor([[-1.2, -1.0]]),
        advantages_B_or_BT=torch.tensor([1.0]),
        mask_BT=torch.tensor([[1, 0]]),
        ref_logprobs_BT=torch.tensor([[-1.1, -1.0]]),
    )
    cfg = LossConfig(beta=0.1, kl_estimator="k2")
    out = compute_policy_loss("ppo_clip", inputs, cfg, normalisers_for(inputs.mask_BT))
    out.loss.backward()
    # Valid token: ρ = e^0.2 > 1.2 with A > 0, so the clipped branch is active (no pg gradient);
    # the k2 term gives d/dlogp [0.1·½(logp - ref)²] = 0.1·(-1 + 1.1) = 0.01 (the issue's value).
    assert inputs.logprobs_BT.grad[0, 0].item() == pytest.approx(0.01, rel=1e-5)
    assert inputs.logprobs_BT.grad[0, 1].item() == 0.0


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
@pytest.mark.parametrize("garbage", [float("nan"), float("-inf")])
@pytest.mark.parametrize("where", ["policy", "reference", "both"])
def test_kl_penalty_ignores_non_finite_padding(kind: str, garbage: float, where: str) -> None:
    """Padding garbage in the policy or reference log-probs reaches neither value nor gradient:
    the result equals that of the same batch with finite values at the masked positions."""
    clean = random_inputs(3)
    clean.mask_BT[3, 4:] = False  # a ragged row with padding after position 4
    dirty = random_inputs(3)
    dirty.mask_BT[3, 4:] = False
    padding_BT = ~dirty.mask_BT
    with torch.no_grad():
        if where in ("policy", "both"):
            dirty.logprobs_BT[padding_BT] = garbage
        if where in ("reference", "both"):
            dirty.ref_logprobs_BT[padding_BT] = garbage
    cfg = LossConfig(beta=0.1, kl_estimator=kind)
    norm = normalisers_for(clean.mask_BT)
    clean_out = compute_policy_loss("ppo_clip", clean, cfg, norm)
    dirty_out = compute_policy_loss("ppo_clip", dirty, cfg, norm)
    clean_out.loss.backward()
    dirty_out.loss.backward()
    assert torch.isfinite(dirty_out.loss)
    assert dirty_out.loss.item() == pytest.approx(clean_out.loss.item(), rel=1e-6)
    assert torch.isfinite(dirty.logprobs_BT.grad).all()
    torch.testing.assert_close(dirty.logprobs_BT.grad, clean.logprobs_BT.grad)
    assert torch.equal(dirty.logprobs_BT.grad[padding_BT], torch.zeros(int(padding_BT.sum())))
    for name, value in dirty_out.metrics.items():
        assert value == pytest.approx(clean_out.metrics[name], rel=1e-6, abs=1e-9), name


def test_approx_kl_is_k3_of_behaviour_against_current() -> None:
    """log π = -1, log π_old = -1.5: ρ = e^0.5, k3 = (ρ - 1) - log ρ = 0.1487 (not 0.1065)."""
    inputs = LossInputs(
        logprobs_BT=torch.tensor([[-1.0, 0.0]]),
        old_logprobs_BT=torch.tensor([[-1.5, 0.0]]),
        advantages_B_or_BT=torch.tensor([1.0]),
        mask_BT=torch.tensor([[1, 0]]),
    )
    out = compute_policy_loss("ppo_clip", inputs, LossConfig(), normalisers_for(inputs.mask_BT))
    expected = (math.exp(0.5) - 1.0) - 0.5
    assert out.metrics["approx_kl"] == pytest.approx(expected, rel=1e-6)
    assert out.metrics["approx_kl"] == pytest.approx(0.1487, abs=1e-4)
