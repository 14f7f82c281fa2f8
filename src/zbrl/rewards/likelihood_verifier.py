"""A likelihood verifier: a reward model that scores a (prompt, response) pair by how likely a
causal LM that solves the task finds each of the response's tokens.

A sequence classifier reads one pooled hidden state and must learn, from labelled pairs, to
compare the written answer with what it would have written; on the embedded task none of the
classifiers we trained did (held-out AUC 0.56-0.72, docs/rewards.md). A causal LM trained on the
task's reference solutions already makes that comparison at every token: a wrong column sum, a
misread operand or a broken format is a token it finds unlikely. This model reads two features
of the response's per-token log-probabilities under such an LM, their minimum and their mean
(each floored at ``min_logprob``), and maps them through a trained linear head to one logit:
``P(correct) = sigmoid(w_min * min + w_mean * mean + b)``. It is the likelihood form of a
generative verifier (Zhang et al. 2024, "Generative Verifiers: Reward Modeling as Next-Token
Prediction", score a response by an LM's next-token probabilities); here the LM is the
verifier's and never the policy's.

It is an ``AutoModelForSequenceClassification`` like any other reward model (registered here as
``model_type: zbrl_likelihood_verifier``): ``from_pretrained`` loads it once this module is
imported, which :class:`zbrl.rewards.reward_model.RewardModelScorer` does. It lives with the
rewards, beside the loader that registers it, so that loading a reward model never reaches up into
``models/``; the embedded build (:mod:`zbrl.embedded.reward_model`) fits one. The response is what
follows the last ``response_start_token_id`` (the chat template's assistant marker) among the
non-pad tokens, up to and including the last one (the turn's end token: a response cut short
makes it unlikely); a sequence without the marker is scored over all its tokens after the first.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import SequenceClassifierOutput

FEATURES = ("min_logprob", "mean_logprob")
"""The head's inputs, in order."""


class LikelihoodVerifierConfig(PretrainedConfig):
    """The verifier's LM (``lm_config``: a causal LM's config as a dict), the token that starts
    the response, and the floor on each token's log-probability."""

    model_type = "zbrl_likelihood_verifier"

    def __init__(
        self,
        lm_config: dict[str, Any] | None = None,
        response_start_token_id: int = -1,
        min_logprob: float = -20.0,
        **kwargs: Any,
    ) -> None:
        self.lm_config = dict(lm_config or {})
        self.response_start_token_id = response_start_token_id
        self.min_logprob = min_logprob
        kwargs["num_labels"] = 1
        super().__init__(**kwargs)


def response_mask_BT(
    input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, start_token_id: int
) -> torch.Tensor:
    """True at the response's tokens: after the last ``start_token_id`` of each row (after the
    first token when a row has none) and not padding."""
    pos_T = torch.arange(input_ids_BT.shape[1], device=input_ids_BT.device)
    is_start_BT = (input_ids_BT == start_token_id) & attention_mask_BT.bool()
    start_B = torch.where(is_start_BT, pos_T, 0).max(dim=1).values  # 0: no marker
    return (pos_T[None, :] > start_B[:, None]) & attention_mask_BT.bool()


def response_logprob_features(
    logits_BTV: torch.Tensor,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    start_token_id: int,
    min_logprob: float,
) -> torch.Tensor:
    """``[B, 2]``: the minimum and the mean, over each row's response tokens, of the token's
    log-probability given what precedes it (``logits_BTV[:, t]`` predicts token ``t + 1``),
    each floored at ``min_logprob``. A row with no response token gets zeros."""
    logp_BT = torch.log_softmax(logits_BTV[:, :-1].float(), dim=-1)
    token_logp_BT = logp_BT.gather(-1, input_ids_BT[:, 1:, None])[..., 0].clamp(min=min_logprob)
    mask_BT = response_mask_BT(input_ids_BT, attention_mask_BT, start_token_id)[:, 1:]
    count_B = mask_BT.sum(dim=1)
    min_B = torch.where(mask_BT, token_logp_BT, torch.inf).min(dim=1).values
    min_B = torch.where(count_B > 0, min_B, 0.0)
    mean_B = torch.where(mask_BT, token_logp_BT, 0.0).sum(dim=1) / count_B.clamp(min=1)
    return torch.stack([min_B, mean_B], dim=1)


class LikelihoodVerifierForSequenceClassification(PreTrainedModel):
    """One logit per sequence from its response's log-probability features (module docstring)."""

    config_class = LikelihoodVerifierConfig
    base_model_prefix = "verifier"

    def __init__(self, config: LikelihoodVerifierConfig) -> None:
        super().__init__(config)
        lm_config = AutoConfig.for_model(**config.lm_config)
        self.lm = AutoModelForCausalLM.from_config(lm_config)
        self.score = nn.Linear(len(FEATURES), 1)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if module is getattr(self, "score", None):  # a neutral head until it is trained
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)

    def features(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, 2]`` log-probability features of each row's response (:data:`FEATURES`)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        logits_BTV = self.lm(input_ids=input_ids, attention_mask=attention_mask).logits
        return response_logprob_features(
            logits_BTV,
            input_ids,
            attention_mask,
            self.config.response_start_token_id,
            self.config.min_logprob,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **_: Any,
    ) -> SequenceClassifierOutput:
        features_BF = self.features(input_ids, attention_mask)
        return SequenceClassifierOutput(logits=self.score(features_BF.to(self.score.weight.dtype)))


def build_likelihood_verifier(
    lm: PreTrainedModel, response_start_token_id: int, *, min_logprob: float = -20.0
) -> LikelihoodVerifierForSequenceClassification:
    """A verifier around a copy of ``lm``'s weights (its input and output embeddings untied, so
    that it saves as plain tensors), with a neutral head (logit 0) to be trained."""
    lm_config = lm.config.to_dict()
    lm_config["tie_word_embeddings"] = False
    config = LikelihoodVerifierConfig(
        lm_config=lm_config,
        response_start_token_id=response_start_token_id,
        min_logprob=min_logprob,
        pad_token_id=lm.config.pad_token_id,
    )
    verifier = LikelihoodVerifierForSequenceClassification(config)
    state = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    if "lm_head.weight" not in state:  # tied: the output embedding is the input's
        state["lm_head.weight"] = lm.get_input_embeddings().weight.detach().clone()
    verifier.lm.load_state_dict(state)
    return verifier


def fit_head(
    verifier: LikelihoodVerifierForSequenceClassification,
    features_NF: torch.Tensor,
    labels_N: torch.Tensor,
    *,
    iterations: int = 200,
) -> float:
    """Fit the head by logistic regression (L-BFGS, full batch) on precomputed features and 0/1
    labels; returns the final mean loss."""
    if features_NF.shape[0] != labels_N.shape[0] or features_NF.shape[1] != len(FEATURES):
        raise ValueError(
            f"fit_head: features {tuple(features_NF.shape)} and labels {tuple(labels_N.shape)} "
            f"do not match ([N, {len(FEATURES)}] and [N])"
        )
    head = verifier.score
    x_NF, y_N = features_NF.float().detach(), labels_N.float().detach()
    optimizer = torch.optim.LBFGS(
        head.parameters(), max_iter=iterations, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(head(x_NF)[:, 0], y_N)
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return nn.functional.binary_cross_entropy_with_logits(head(x_NF)[:, 0], y_N).item()


AutoConfig.register(LikelihoodVerifierConfig.model_type, LikelihoodVerifierConfig, exist_ok=True)
AutoModelForSequenceClassification.register(
    LikelihoodVerifierConfig, LikelihoodVerifierForSequenceClassification, exist_ok=True
)
