"""Off-policy corrections (decoupled, TIS, MIS at three levels), GSPO, GAE and the value loss
against plain-Python loop references on random ragged inputs — values and gradients — plus the
reductions to the uncorrected forms."""

from __future__ import annotations

import math

import pytest
import torch

from zbrl.algorithms import LossConfig, LossInputs, compute_policy_loss, normalisers_for
from zbrl.algorithms.correction import loglinear_alpha, loglinear_proximal
from zbrl.algorithms.gae import explained_variance, gae, token_rewards, value_loss, whiten

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LEVELS = ("token", "sequence", "geometric")


def ragged_inputs(seed: int, *, spread: float = 0.4) -> LossInputs:
    gen = torch.Generator().manual_seed(seed)
    batch, length = 5, 8
    behaviour = -torch.rand(batch, length, generator=gen) * 3.0
    proximal = behaviour + torch.randn(batch, length, generator=gen) * 0.3
    logp = proximal + torch.randn(batch, length, generator=gen) * spread
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0] = 0
    lengths[1] = length
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    return LossInputs(
        logprobs_BT=logp.requires_grad_(True),
        old_logprobs_BT=behaviour,
        advantages_B_or_BT=torch.randn(batch, generator=gen),
        mask_BT=mask,
        proximal_logprobs_BT=proximal,
    )


def denominators(mask: list[list[int]], mode: str, norm) -> list[float]:
    """The divisor of each sequence's token losses under ``mode``."""
    out = []
    for row in mask:
        if mode == "token-mean":
            out.append(norm.tokens)
        elif mode == "seq-mean-token-mean":
            out.append(norm.seqs * max(sum(row), 1))
        elif mode == "seq-mean-token-sum":
            out.append(norm.seqs)
        else:
            out.append(norm.seqs * norm.norm_tokens)
    return out


def level_log(values: list[float], mask: list[int], t: int, level: str) -> float:
    valid = [v for v, m in zip(values, mask, strict=True) if m]
    if level == "token":
        return values[t]
    if level == "sequence":
        return sum(valid)
    return sum(valid) / len(valid)


def d_level_log(mask: list[int], t: int, u: int, level: str) -> float:
    """∂(level log-ratio at token t) / ∂(log-ratio at token u), both valid, same sequence."""
    if level == "token":
        return 1.0 if t == u else 0.0
    if level == "sequence":
        return 1.0
    return 1.0 / sum(mask)


def as_lists(inputs: LossInputs):
    return (
        inputs.logprobs_BT.tolist(),
        inputs.old_logprobs_BT.tolist(),
        inputs.proximal_logprobs_BT.tolist(),
        inputs.mask_BT.int().tolist(),
        inputs.advantages_B_or_BT.tolist(),
    )


def clip_branch(ratio: float, adv: float, lo: float, hi: float) -> tuple[float, bool]:
    """(PPO clipped surrogate, whether the unclipped branch carries the gradient)."""
    clipped = min(max(ratio, 1 - lo), 1 + hi)
    unclipped, other = -ratio * adv, -clipped * adv
    return max(unclipped, other), unclipped >= other and not (
        (adv > 0 and ratio > 1 + hi) or (adv < 0 and ratio < 1 - lo)
    )


def ref_decoupled(inputs: LossInputs, cfg: LossConfig, norm) -> tuple[float, list[list[float]]]:
    logp, behav, prox, mask, adv = as_lists(inputs)
    den = denominators(mask, cfg.aggregation, norm)
    total, grad = 0.0, []
    for b in range(len(logp)):
        row_grad = [0.0] * len(logp[b])
        log_w = [p - q for p, q in zip(prox[b], behav[b], strict=True)]
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            weight = min(math.exp(level_log(log_w, mask[b], t, cfg.correction_level)), 1e30)
            weight = min(weight, cfg.correction_cap)
            ratio = math.exp(logp[b][t] - prox[b][t])
            pg, active = clip_branch(ratio, adv[b], cfg.clip_eps_low, cfg.clip_eps_high)
            total += weight * pg / den[b]
            row_grad[t] = weight * -adv[b] * ratio / den[b] if active else 0.0
        grad.append(row_grad)
    return total, grad


def ref_is(inputs: LossInputs, cfg: LossConfig, norm) -> tuple[float, list[list[float]]]:
    """TIS / MIS: per token c_t = -min(ρ_t, C)·A (tis) or -ρ_t·A·[ρ_t <= C] (mis) at the level;
    value Σ c_t / den, gradient wrt logp_u = Σ_t c_t·∂log ρ_t/∂logp_u / den."""
    logp, behav, _, mask, adv = as_lists(inputs)
    den = denominators(mask, cfg.aggregation, norm)
    total, grad = 0.0, []
    for b in range(len(logp)):
        log_r = [p - q for p, q in zip(logp[b], behav[b], strict=True)]
        coef = [0.0] * len(log_r)
        for t in range(len(log_r)):
            if not mask[b][t]:
                continue
            ratio = math.exp(level_log(log_r, mask[b], t, cfg.correction_level))
            if cfg.correction == "tis":
                coef[t] = -min(ratio, cfg.correction_cap) * adv[b]
            else:
                coef[t] = -ratio * adv[b] if ratio <= cfg.correction_cap else 0.0
            total += coef[t] / den[b]
        row_grad = []
        for u in range(len(log_r)):
            g = 0.0
            if mask[b][u]:
                for t in range(len(log_r)):
                    if mask[b][t]:
                        g += coef[t] * d_level_log(mask[b], t, u, cfg.correction_level) / den[b]
            row_grad.append(g)
        grad.append(row_grad)
    return total, grad


def ref_gspo(inputs: LossInputs, cfg: LossConfig, norm) -> tuple[float, list[list[float]]]:
    """Token-form GSPO: every token's ratio is s = exp(mean log(π/π_anchor)) of its sequence,
    and d s_t / d logp_t = s (its own token only)."""
    logp, behav, prox, mask, adv = as_lists(inputs)
    anchor = prox if cfg.correction == "decoupled" else behav
    den = denominators(mask, cfg.aggregation, norm)
    total, grad = 0.0, []
    for b in range(len(logp)):
        row_grad = [0.0] * len(logp[b])
        valid = [t for t in range(len(logp[b])) if mask[b][t]]
        if valid:
            s = math.exp(sum(logp[b][t] - anchor[b][t] for t in valid) / len(valid))
            log_w = [p - q for p, q in zip(prox[b], behav[b], strict=True)]
            for t in valid:
                weight = 1.0
                if cfg.correction == "decoupled":
                    w = math.exp(level_log(log_w, mask[b], t, cfg.correction_level))
                    weight = min(w, cfg.correction_cap)
                pg, active = clip_branch(s, adv[b], cfg.clip_eps_low, cfg.clip_eps_high)
                total += weight * pg / den[b]
                row_grad[t] = weight * -adv[b] * s / den[b] if active else 0.0
        grad.append(row_grad)
    return total, grad


def check(name: str, inputs: LossInputs, cfg: LossConfig, reference) -> dict[str, float]:
    norm = normalisers_for(inputs.mask_BT, norm_tokens=12.0)
    out = compute_policy_loss(name, inputs, cfg, norm)
    out.loss.backward()
    value, grad = reference(inputs, cfg, norm)
    assert out.loss.item() == pytest.approx(value, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(inputs.logprobs_BT.grad, torch.tensor(grad), rtol=1e-4, atol=1e-6)
    return out.metrics


# ----------------------------------------------------------------------------- loop references


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
def test_decoupled_matches_loop_reference(seed, level, mode):
    cfg = LossConfig(
        correction="decoupled", correction_level=level, correction_cap=1.5, aggregation=mode
    )
    metrics = check("ppo_clip", ragged_inputs(seed), cfg, ref_decoupled)
    assert metrics["is_weight_max"] >= metrics["is_weight_mean"] > 0
    assert 0.0 <= metrics["is_capped_frac"] <= 1.0
    assert metrics["behav_prox_k3"] > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("correction", ["tis", "mis"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_tis_and_mis_match_loop_reference(seed, level, correction, mode):
    cap = 1.3 if level != "sequence" else 2.5
    cfg = LossConfig(
        correction=correction, correction_level=level, correction_cap=cap, aggregation=mode
    )
    metrics = check("ppo_clip", ragged_inputs(seed), cfg, ref_is)
    key = "is_masked_frac" if correction == "mis" else "is_capped_frac"
    assert metrics[key] < 1.0
    if level == "token":
        assert metrics[key] > 0.0  # the cap binds on some tokens


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("correction", ["none", "decoupled"])
@pytest.mark.parametrize("mode", MODES)
def test_gspo_matches_loop_reference(seed, correction, mode):
    cfg = LossConfig(clip_eps_low=0.05, clip_eps_high=0.08, correction=correction, aggregation=mode)
    check("gspo", ragged_inputs(seed, spread=0.05), cfg, ref_gspo)


# ------------------------------------------------------------------------------------ reductions


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("level", LEVELS)
def test_decoupled_with_behaviour_equal_proximal_is_ppo(seed, level):
    outs = []
    for correction in ("decoupled", "none"):
        inputs = ragged_inputs(seed)
        inputs.proximal_logprobs_BT = inputs.old_logprobs_BT.clone()
        cfg = LossConfig(correction=correction, correction_level=level, dual_clip_c=3.0)
        out = compute_policy_loss("ppo_clip", inputs, cfg, normalisers_for(inputs.mask_BT))
        out.loss.backward()
        outs.append((out, inputs.logprobs_BT.grad))
    (dec, dec_grad), (ppo, ppo_grad) = outs
    assert dec.loss.item() == ppo.loss.item()
    assert torch.equal(dec_grad, ppo_grad)
    assert dec.metrics["is_weight_mean"] == 1.0 and dec.metrics["is_capped_frac"] == 0.0
    assert dec.metrics["behav_prox_k3"] == 0.0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("level", LEVELS)
def test_tis_with_infinite_cap_is_plain_is_and_mis_masks_nothing(seed, level):
    """Plain IS: loss -ρ·A (ρ at the level), gradient -ρ·A·∇log ρ; the cap never binds."""
    results = {}
    for correction in ("tis", "mis"):
        inputs = ragged_inputs(seed)
        cfg = LossConfig(correction=correction, correction_level=level, correction_cap=math.inf)
        norm = normalisers_for(inputs.mask_BT)
        out = compute_policy_loss("ppo_clip", inputs, cfg, norm)
        out.loss.backward()
        results[correction] = (out, inputs.logprobs_BT.grad)
    inputs = ragged_inputs(seed)
    valid = inputs.mask_BT
    log_r = torch.where(valid, inputs.logprobs_BT - inputs.old_logprobs_BT, 0.0)
    if level == "sequence":
        log_r = log_r.sum(1, keepdim=True).expand_as(log_r)
    elif level == "geometric":
        log_r = (log_r.sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp_min(1)).expand_as(
            log_r
        )
    plain = torch.where(valid, -log_r.exp() * inputs.advantages_B_or_BT.unsqueeze(1), 0.0)
    plain = plain.sum() / valid.sum()
    plain.backward()
    for correction, (out, grad) in results.items():
        assert out.loss.item() == pytest.approx(plain.item(), rel=1e-6), correction
        torch.testing.assert_close(grad, inputs.logprobs_BT.grad, rtol=1e-6, atol=1e-8)
    assert results["mis"][0].metrics["is_masked_frac"] == 0.0
    assert results["tis"][0].metrics["is_capped_frac"] == 0.0


def test_decoupled_weight_metrics_on_known_inputs():
    behaviour = torch.log(torch.tensor([[0.1, 0.2, 0.5, 0.4]]))
    proximal = torch.log(torch.tensor([[0.3, 0.2, 0.25, 0.4]]))  # weights 3, 1, 0.5, masked
    inputs = LossInputs(
        logprobs_BT=proximal.clone().requires_grad_(True),
        old_logprobs_BT=behaviour,
        advantages_B_or_BT=torch.tensor([1.0]),
        mask_BT=torch.tensor([[1, 1, 1, 0]]),
        proximal_logprobs_BT=proximal,
    )
    cfg = LossConfig(correction="decoupled", correction_cap=2.0)
    out = compute_policy_loss("ppo_clip", inputs, cfg, normalisers_for(inputs.mask_BT))
    m = out.metrics
    assert m["is_weight_mean"] == pytest.approx((3 + 1 + 0.5) / 3, rel=1e-5)
    assert m["is_weight_max"] == pytest.approx(3.0, rel=1e-5)
    assert m["is_capped_frac"] == pytest.approx(1 / 3)
    assert out.loss.item() == pytest.approx(-(2.0 + 1.0 + 0.5) / 3, rel=1e-5)  # ratio 1, capped
    k3 = sum(r - math.log(r) - 1 for r in (3.0, 1.0, 0.5)) / 3  # k3 of KL(behaviour ‖ proximal)
    assert m["behav_prox_k3"] == pytest.approx(k3, rel=1e-5)


def test_decoupled_without_proximal_and_gspo_with_tis_are_clear_errors():
    inputs = ragged_inputs(0)
    inputs.proximal_logprobs_BT = None
    norm = normalisers_for(inputs.mask_BT)
    with pytest.raises(ValueError, match="proximal_logprobs_BT"):
        compute_policy_loss("ppo_clip", inputs, LossConfig(correction="decoupled"), norm)
    with pytest.raises(ValueError, match="gspo clips its own"):
        compute_policy_loss("gspo", inputs, LossConfig(correction="tis"), norm)


def test_loglinear_proximal_interpolates_by_version():
    behaviour, current = torch.tensor([[-2.0, -1.0]]), torch.tensor([[-1.0, -3.0]])
    alpha = loglinear_alpha(torch.tensor([0, 3, 1]), updates_done=1)
    assert alpha.tolist() == pytest.approx([0.0, 0.75, 0.5])
    assert loglinear_alpha(torch.tensor([0]), updates_done=0).tolist() == [1.0]
    assert loglinear_alpha(torch.tensor([2]), updates_done=0).tolist() == [1.0]
    got = loglinear_proximal(behaviour.expand(3, 2), current.expand(3, 2), alpha)
    expected = [[b + a * (c - b) for b, c in zip([-2.0, -1.0], [-1.0, -3.0])] for a in alpha]
    torch.testing.assert_close(got, torch.tensor(expected))


# ----------------------------------------------------------------------------------- GAE, critic


def ragged_values(seed: int):
    gen = torch.Generator().manual_seed(seed)
    batch, length = 4, 7
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0] = length
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    values = torch.randn(batch, length, generator=gen)
    rewards = torch.randn(batch, length, generator=gen)
    return rewards, values, mask


def ref_gae(rewards, values, mask, gamma, lam):
    adv_rows, ret_rows = [], []
    for r_row, v_row, m_row in zip(rewards.tolist(), values.tolist(), mask.tolist(), strict=True):
        n = sum(m_row)
        adv = [0.0] * len(r_row)
        running = 0.0
        for t in reversed(range(n)):
            next_value = v_row[t + 1] if t + 1 < n else 0.0
            delta = r_row[t] + gamma * next_value - v_row[t]
            running = delta + gamma * lam * running
            adv[t] = running
        adv_rows.append(adv)
        ret_rows.append([a + v if t < n else 0.0 for t, (a, v) in enumerate(zip(adv, v_row))])
    return torch.tensor(adv_rows), torch.tensor(ret_rows)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.8), (0.99, 0.0)])
def test_gae_matches_loop_reference(seed, gamma, lam):
    rewards, values, mask = ragged_values(seed)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    want_adv, want_ret = ref_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, want_adv, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ret, want_ret, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_gae_with_unit_gamma_and_lambda_is_returns_minus_values(seed):
    rewards, values, mask = ragged_values(seed)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    masked_rewards = torch.where(mask, rewards, 0.0)
    returns_to_go = masked_rewards.flip(1).cumsum(1).flip(1)
    torch.testing.assert_close(adv, torch.where(mask, returns_to_go - values, 0.0))
    torch.testing.assert_close(ret, torch.where(mask, returns_to_go, 0.0))


def test_token_rewards_put_the_reward_last_and_fold_the_kl():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    rewards = token_rewards(torch.tensor([1.0, -0.5, 9.0]), mask)
    assert rewards.tolist() == [[0, 0, 1.0, 0], [-0.5, 0, 0, 0], [0, 0, 0, 0]]
    behaviour = torch.full((3, 4), -1.0)
    ref = torch.full((3, 4), -1.5)
    with_kl = token_rewards(
        torch.tensor([1.0, -0.5, 9.0]), mask, kl_coef=0.1, behaviour_BT=behaviour, ref_BT=ref
    )
    torch.testing.assert_close(with_kl, rewards - 0.05 * mask.float())


def test_whiten_uses_valid_tokens_only():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert whiten(x, mask)[0].tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_matches_loop_reference(seed, clip):
    gen = torch.Generator().manual_seed(seed)
    rewards, old, mask = ragged_values(seed)
    values = (old + torch.randn(old.shape, generator=gen) * 0.5).requires_grad_(True)
    returns = rewards
    norm = normalisers_for(mask)
    loss, metrics = value_loss(
        values, old, returns, mask, clip=clip, aggregation="token-mean", norm=norm
    )
    loss.backward()
    total, grads, clipped = 0.0, [], 0
    for v_row, o_row, r_row, m_row in zip(
        values.tolist(), old.tolist(), returns.tolist(), mask.tolist(), strict=True
    ):
        g_row = []
        for v, o, r, m in zip(v_row, o_row, r_row, m_row, strict=True):
            if not m:
                g_row.append(0.0)
                continue
            plain = (v - r) ** 2
            if clip is None:
                total += 0.5 * plain
                g_row.append((v - r) / norm.tokens)
                continue
            v_clip = o + min(max(v - o, -clip), clip)
            other = (v_clip - r) ** 2
            total += 0.5 * max(plain, other)
            if other > plain:
                clipped += 1
                inside = abs(v - o) < clip
                g_row.append((v_clip - r) / norm.tokens if inside else 0.0)
            else:
                g_row.append((v - r) / norm.tokens)
        grads.append(g_row)
    assert loss.item() == pytest.approx(total / norm.tokens, rel=1e-5)
    torch.testing.assert_close(values.grad, torch.tensor(grads), rtol=1e-5, atol=1e-7)
    assert metrics["value_clip_frac"].item() == pytest.approx(clipped / norm.tokens)


def test_explained_variance():
    mask = torch.tensor([[1, 1, 1, 0]])
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.0), returns, mask) == pytest.approx(0.0)
    noisy = torch.tensor([[1.5, 2.0, 2.5, 0.0]])  # residual var 1/6 of var 2/3
    assert explained_variance(noisy, returns, mask) == pytest.approx(0.75)
    assert explained_variance(returns, torch.ones(1, 4), mask) == 0.0
