"""The likelihood verifier (zbrl.rewards.likelihood_verifier): its response mask and features
against a per-row loop, its head fit, a save/load round trip through
AutoModelForSequenceClassification and the reward scorer, and the embedded build."""

from __future__ import annotations

import math

import pytest
import torch

from zbrl.rewards.likelihood_verifier import (
    LikelihoodVerifierForSequenceClassification,
    build_likelihood_verifier,
    fit_head,
    response_logprob_features,
    response_mask_BT,
)
from zbrl.rewards.reward_model import RewardModelScorer

PROMPT = [{"role": "user", "content": "What is 2+3?"}]
START = 9


def loop_features(logits_BTV, ids_BT, mask_BT, start_id, floor):
    """One row at a time, one token at a time: the response is what follows the row's last
    ``start_id`` (or its first token) among its real tokens."""
    out = []
    for b in range(ids_BT.shape[0]):
        real = [t for t in range(ids_BT.shape[1]) if mask_BT[b, t]]
        starts = [t for t in real if ids_BT[b, t] == start_id]
        first = (starts[-1] if starts else 0) + 1
        values = []
        for t in real:
            if t >= first:
                logp = torch.log_softmax(logits_BTV[b, t - 1].double(), -1)[ids_BT[b, t]]
                values.append(max(float(logp), floor))
        out.append([min(values), sum(values) / len(values)] if values else [0.0, 0.0])
    return torch.tensor(out)


def test_features_match_a_per_token_loop_with_markers_padding_and_floor():
    gen = torch.Generator().manual_seed(0)
    ids_BT = torch.randint(0, 9, (4, 7), generator=gen)  # no START anywhere yet
    ids_BT[0, 2] = START  # response = tokens 3..6
    ids_BT[1, 1] = START
    ids_BT[1, 4] = START  # the LAST marker counts: tokens 5..
    mask_BT = torch.ones(4, 7, dtype=torch.long)
    mask_BT[1, 6] = 0  # right padding
    ids_BT[2, 6] = START  # the marker is the last real token: no response token
    mask_BT[3, 5:] = 0  # no marker at all: every real token after the first
    ids_BT[3, 6] = START  # a marker inside the padding does not count
    logits_BTV = torch.randn(4, 7, 12, generator=gen) * 4
    got = response_logprob_features(logits_BTV, ids_BT, mask_BT, START, -3.0)
    want = loop_features(logits_BTV, ids_BT, mask_BT, START, -3.0)
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)
    assert got[2].tolist() == [0.0, 0.0]
    assert (got[:, 0] >= -3.0).all()  # floored
    mask = response_mask_BT(ids_BT, mask_BT, START)
    assert mask[0].tolist() == [False] * 3 + [True] * 4
    assert mask[1].tolist() == [False] * 5 + [True, False]
    assert mask[3].tolist() == [False] + [True] * 4 + [False] * 2


def test_fit_head_separates_the_labels_and_refuses_mismatched_shapes(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    verifier = build_likelihood_verifier(AutoModelForCausalLM.from_pretrained(tiny_model_dir), 5)
    assert verifier.score.weight.abs().sum() == 0  # neutral until fitted: sigmoid(0) = 0.5
    gen = torch.Generator().manual_seed(1)
    labels_N = (torch.rand(400, generator=gen) < 0.3).float()
    # right answers: every token likely; wrong ones: one unlikely token
    min_N = torch.where(labels_N == 1, -0.2, -4.0) + 0.3 * torch.randn(400, generator=gen)
    features_NF = torch.stack([min_N, min_N / 8], dim=1)
    loss = fit_head(verifier, features_NF, labels_N)
    assert loss < 0.05 < math.log(2)
    with torch.no_grad():
        predicted_N = verifier.score(features_NF)[:, 0] > 0
    assert (predicted_N == labels_N.bool()).float().mean() > 0.99
    with pytest.raises(ValueError, match=r"fit_head: features \(400, 2\) and labels \(3,\)"):
        fit_head(verifier, features_NF, labels_N[:3])


def test_a_saved_verifier_loads_as_a_sequence_classifier_and_scores_by_mean_log_prob(
    tmp_path, tiny_model_dir
):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    marker = tokenizer.convert_tokens_to_ids("<|assistant|>")
    verifier = build_likelihood_verifier(lm, marker)
    with torch.no_grad():
        verifier.score.weight[:] = torch.tensor([[0.0, 1.0]])  # logit = mean log-prob
    verifier.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    assert isinstance(loaded, LikelihoodVerifierForSequenceClassification)
    assert loaded.config.response_start_token_id == marker
    for name, value in lm.state_dict().items():  # the LM's weights, untied, unchanged
        torch.testing.assert_close(loaded.lm.state_dict()[name], value)
    # the scorer's logit is the mean log-prob of the response's tokens (and the turn's end)
    responses = ["<think>2+3=5</think><answer>5</answer>", "%%%%"]
    want = []
    for response in responses:
        ids_T = tokenizer(_render(tokenizer, response), add_special_tokens=False)["input_ids"]
        first = len(ids_T) - ids_T[::-1].index(marker)  # after the last assistant marker
        with torch.no_grad():
            logp_TV = torch.log_softmax(lm(torch.tensor([ids_T])).logits[0].double(), -1)
        logps = [max(logp_TV[t - 1, ids_T[t]].item(), -20.0) for t in range(first, len(ids_T))]
        want.append(sum(logps) / len(logps))
    scorer = RewardModelScorer(tmp_path / "rm", normalize="none")
    assert scorer.score([PROMPT, PROMPT], responses) == pytest.approx(want, abs=1e-4)


def _render(tokenizer, response):
    from zbrl.rewards.reward_model import render_pair

    return render_pair(tokenizer, PROMPT, response)


def test_the_embedded_build_fits_a_likelihood_verifier_and_records_its_figures(
    tmp_path, tiny_model_dir
):
    from transformers import AutoConfig

    from zbrl.embedded.reward_model import ensure_reward_model, read_reward_model_summary

    small = {"n_prompts": 6, "samples_per_prompt": 2, "eval_prompts": 3, "max_new_tokens": 8,
             "backbone_sft_steps": None}  # fmt: skip
    built = ensure_reward_model(tmp_path, tiny_model_dir, verbose=False, **small)
    summary = read_reward_model_summary(built)
    assert summary["settings"]["objective"] == "likelihood"  # the default
    assert summary["heldout"]["pairs"] == 3 * 2 and summary["heldout"]["corruption_pairs"] == 18
    assert AutoConfig.from_pretrained(built).model_type == "zbrl_likelihood_verifier"
    (score,) = RewardModelScorer(built).score([PROMPT], ["<answer>5</answer>"])
    assert 0.0 < score < 1.0
