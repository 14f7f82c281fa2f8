"""Per-token policy versions on the training side: per-token staleness, the rollout log's version
changes, the mismatch/drift split, and the off-policy corrections per token (behaviour log-probs
and the log-linear proximal policy of responses whose tokens come from two versions)."""

import math
import pickle

import pytest
import torch
from test_consumer import make_group, make_trainer
from test_mismatch import _true_logprobs
from test_train_step_offpolicy import trainer_for

from zbrl.algorithms.correction import behaviour_weight, loglinear_alpha, loglinear_proximal
from zbrl.algorithms.mismatch import split_mismatch_metrics
from zbrl.training.consumer import token_staleness, version_changes
from zbrl.training.rows import build_rows, collate, response_span


def two_version_group(seed, old, new, switch_at, **kw):
    """A group whose responses were sampled by ``old`` up to token ``switch_at`` and by
    ``new`` after it (policy_version: the oldest)."""
    group = make_group(seed, version=old, **kw)
    group.token_versions = [
        torch.tensor([old if t < switch_at else new for t in range(r.numel())])
        for r in group.response_ids
    ]
    return group


def test_versions_default_to_the_group_version_and_survive_pickling():
    plain = make_group(1, version=3, lengths=(2, 1, 0, 3))
    assert [plain.versions(g).tolist() for g in range(4)] == [[3, 3], [3], [], [3, 3, 3]]
    mixed = two_version_group(2, 3, 4, switch_at=2, lengths=(3, 2, 4, 1))
    back = pickle.loads(pickle.dumps(mixed))
    assert [v.tolist() for v in back.token_versions] == [[3, 3, 4], [3, 3], [3, 3, 4, 4], [3]]
    assert pickle.loads(pickle.dumps(plain)).token_versions is None


def test_token_staleness_against_a_loop():
    groups = [
        two_version_group(1, 2, 4, switch_at=1, lengths=(3, 2, 4, 1)),
        make_group(2, version=3, lengths=(2, 5, 1, 2)),
        two_version_group(3, 4, 5, switch_at=3, lengths=(4, 4, 0, 6)),
    ]
    groups[2].loss_masks = [  # an episode: environment tokens (False) do not count
        torch.tensor([True, False, True, True]),
        torch.ones(4, dtype=torch.bool),
        torch.zeros(0, dtype=torch.bool),
        torch.tensor([True, True, False, False, True, True]),
    ]
    trained_at = 5
    behind = []
    for group in groups:
        for g in range(group.group_size):
            for t in range(group.response_ids[g].numel()):
                if group.loss_masks is None or bool(group.loss_masks[g][t]):
                    version = (
                        group.policy_version
                        if group.token_versions is None
                        else int(group.token_versions[g][t])
                    )
                    behind.append(trained_at - version)
    got = token_staleness(groups, trained_at)
    assert got["token_staleness_mean"] == pytest.approx(sum(behind) / len(behind))
    assert got["token_staleness_max"] == max(behind) == 3
    assert token_staleness([], 1) == {"token_staleness_mean": 0.0, "token_staleness_max": 0.0}


def test_version_changes_mark_where_a_response_changed_version():
    assert version_changes(torch.tensor([3, 3, 3])) == [[0, 3]]
    assert version_changes(torch.tensor([3, 3, 4, 4, 5])) == [[0, 3], [2, 4], [4, 5]]
    assert version_changes(torch.tensor([], dtype=torch.long)) == []


def test_mismatch_and_drift_split_on_a_hand_made_example():
    trainer = torch.tensor([[-1.0, -2.0, -3.0, 0.0], [-1.0, -1.5, 0.0, 0.0]])
    behaviour = torch.tensor([[-1.1, -2.0, -2.5, 0.0], [-0.8, -1.5, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    same = torch.tensor([[True, True, False, True], [False, False, True, True]])
    (mis, n_mis), (drift, n_drift), (frac, n_all) = split_mismatch_metrics(
        trainer, behaviour, mask, same
    )
    # mismatch over (0,0) Δ=0.1 and (0,1) Δ=0; drift over (0,2) Δ=-0.5, (1,0) Δ=-0.2, (1,1) Δ=0
    assert (n_mis, n_drift, n_all) == (2.0, 3.0, 5.0)
    assert mis["mismatch_abs_logp"] == pytest.approx(0.05)
    assert mis["mismatch_k3"] == pytest.approx((math.expm1(0.1) - 0.1) / 2)
    assert mis["mismatch_ratio_max"] == pytest.approx(math.exp(0.1))
    assert drift["drift_abs_logp"] == pytest.approx(0.7 / 3)
    assert drift["drift_k3"] == pytest.approx((math.expm1(-0.5) + 0.5 + math.expm1(-0.2) + 0.2) / 3)
    assert drift["drift_ratio_max"] == pytest.approx(1.0)
    assert frac == {"drift_token_frac": pytest.approx(0.6)}


def test_train_step_reports_mismatch_on_current_tokens_and_drift_on_older_ones(tiny_model_dir):
    """Tokens of the trained version carry the trainer's own log-probs (mismatch 0), older
    tokens are off by 0.3 (drift 0.3 there, and only there)."""
    trainer = make_trainer(tiny_model_dir, microbatch_size=8)
    group = two_version_group(1, 1, 2, switch_at=2, rewards=(1.0,) * 4, lengths=(3, 2, 4, 1))
    true = _true_logprobs(trainer.engine.policy, group)
    group.behaviour_logprobs = [
        torch.where(v == 2, lp, lp + 0.3) for lp, v in zip(true, group.token_versions)
    ]
    metrics = trainer.train([group], policy_version=2)
    old_tokens = sum(int((v == 1).sum()) for v in group.token_versions)
    assert metrics["mismatch_abs_logp"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["drift_abs_logp"] == pytest.approx(0.3, abs=1e-5)
    assert metrics["drift_ratio_max"] == pytest.approx(math.exp(-0.3), abs=1e-5)
    assert metrics["drift_token_frac"] == pytest.approx(old_tokens / 10)


def test_rows_carry_per_token_behaviour_logprobs_and_staleness():
    group = two_version_group(4, 2, 3, switch_at=2, lengths=(3, 2, 4, 1))
    group.behaviour_logprobs = [-torch.rand(r.numel()) for r in group.response_ids]
    rows = build_rows(
        [group],
        torch.zeros(1, 4),
        filter_truncated=False,
        loss_filter_range=None,
        trained_version=4,
    )
    mb = collate(rows, pad_id=0)
    for i, row in enumerate(rows):
        span = response_span(row)
        assert torch.equal(mb.old_logprobs_BT[i, span], group.behaviour_logprobs[i])
        assert mb.behind_BT[i, span].tolist() == [4 - int(v) for v in group.token_versions[i]]
        assert int(mb.behind_B[i]) == 2  # the oldest token's


def test_corrections_weigh_each_token_by_its_own_behaviour_and_versions():
    """decoupled's weight and the log-linear proximal policy per token, against a loop, for a
    response sampled by two versions."""
    g = torch.Generator().manual_seed(0)
    behaviour = -torch.rand(2, 5, generator=g) * 3
    proximal = behaviour + torch.randn(2, 5, generator=g) * 0.2
    current = proximal + torch.randn(2, 5, generator=g) * 0.1
    valid = torch.ones(2, 5, dtype=torch.bool)
    behind = torch.tensor([[2, 2, 1, 1, 1], [1, 1, 1, 0, 0]])
    weight, _ = behaviour_weight(behaviour, proximal, valid, "token", cap=5.0)
    alpha = loglinear_alpha(behind * 2, updates_done=1)
    approx = loglinear_proximal(behaviour, current, alpha)
    for b in range(2):
        for t in range(5):
            want = min(math.exp(float(proximal[b, t] - behaviour[b, t])), 5.0)
            assert float(weight[b, t]) == pytest.approx(want, rel=1e-5)
            a = (2 * int(behind[b, t])) / (2 * int(behind[b, t]) + 1)
            mixed = float(behaviour[b, t]) + a * float(current[b, t] - behaviour[b, t])
            assert float(approx[b, t]) == pytest.approx(mixed, abs=1e-6)
    # per sequence (one α per row) is still accepted
    alpha_B = loglinear_alpha(torch.tensor([2, 0]), updates_done=0)
    assert alpha_B.tolist() == [1.0, 1.0]
    assert loglinear_proximal(behaviour, current, alpha_B).shape == (2, 5)


def test_loglinear_train_step_uses_per_token_versions(tiny_model_dir):
    """Two optimizer steps per batch: in the second, α is 2/3 on tokens one version behind and
    0 on current ones, token by token inside each response."""
    trainer = trainer_for(
        tiny_model_dir,
        "algorithm.correction=decoupled",
        "algorithm.proximal=loglinear",
        "training.train_minibatch_size=1",
    )
    seen = []
    original = trainer._proximal

    def spy(mb, old_logp, logp, steps):
        out = original(mb, old_logp, logp, steps)
        seen.append(
            (trainer._updates_in_batch, mb.behind_BT, mb.mask_BT, old_logp, logp.detach(), out)
        )
        return out

    trainer._proximal = spy
    groups = [two_version_group(s, 1, 2, switch_at=2) for s in range(2)]
    trainer.train(groups, policy_version=2)
    assert sorted({u for u, *_ in seen}) == [0, 1]
    for updates, behind, mask, old, logp, prox in seen:
        assert bool((behind[mask] == 1).any()) and bool((behind[mask] == 0).any())
        for b, t in mask.nonzero().tolist():
            k = 2 * int(behind[b, t])  # optimizer steps behind (2 per version)
            alpha = 1.0 if k + updates == 0 else k / (k + updates)
            want = float(old[b, t]) + alpha * float(logp[b, t] - old[b, t])
            assert float(prox[b, t]) == pytest.approx(want, abs=1e-5)
