"""Reward models: a sequence-classification model scores (prompt, response) pairs in batches.

* :class:`RewardModelScorer` loads ``AutoModelForSequenceClassification`` and its tokenizer from a
  local directory (the driver resolves hub ids and GGUF files to one first, as for the policy) and
  turns pairs of (prompt messages, response) into scores, ``batch_size`` pairs per forward pass.
  A pair is rendered with the tokenizer's chat template (the prompt's messages plus the response
  as the assistant's turn) by :func:`render_pair`, the same function that builds a reward model's
  training text, so training and scoring see the same text.
* :class:`ClassifierReward` is the reward function: it sends a whole batch to a scorer (in this
  process, or a reward worker placed by Ray: anything with ``score(prompts, responses)``) under a
  deadline; a batch that misses it or whose scorer fails gets no score (its responses are
  failed results, never trained), counted, with a warning, and never stops the producer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from zbrl.rewards.base import Example, RewardBatch, RewardFunction, RewardResult
from zbrl.rewards.learned import LearnedReward
from zbrl.rewards.registry import build_reward, register_reward

Messages = list[dict[str, Any]]


class PairScorer(Protocol):
    """Scores (prompt messages, response) pairs: one float per pair, in order."""

    def score(self, prompts: Sequence[Messages], responses: Sequence[str]) -> list[float]: ...


def render_pair(tokenizer: Any, prompt: Messages, response: str) -> str:
    """The text a reward model reads for one pair: the chat template over the prompt's messages
    and the response as the assistant's turn (plain ``role: content`` lines without a
    template)."""
    messages = [*prompt, {"role": "assistant", "content": response}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


class RewardModelScorer:
    """A sequence-classification model and its tokenizer, scoring pairs in batches."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        tokenizer_dir: str | Path | None = None,
        batch_size: int = 16,
        max_length: int = 512,
        normalize: Literal["none", "sigmoid"] = "sigmoid",
        device: str = "cpu",
        dtype: Any = None,
    ) -> None:
        """``device`` and ``dtype`` (a torch dtype; None: float32) the model scores on."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        import zbrl.rewards.likelihood_verifier  # noqa: F401  (registers zbrl's verifier type)

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"  # keep the response, drop the prompt's start
        self.model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, dtype=dtype if dtype is not None else torch.float32
        )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(device).eval()
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.max_length = max_length
        self.normalize = normalize

    def score(self, prompts: Sequence[Messages], responses: Sequence[str]) -> list[float]:
        import torch

        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
        texts = [render_pair(self.tokenizer, p, r) for p, r in zip(prompts, responses)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=False,
            ).to(self.device)
            with torch.inference_mode():
                logits_BL = self.model(**batch).logits.float()
            scores += _to_scores(logits_BL, self.normalize)
        return scores


def _to_scores(logits_BL: Any, normalize: str) -> list[float]:
    if normalize == "none":
        return logits_BL[:, -1].tolist()
    if logits_BL.shape[-1] == 1:
        return logits_BL[:, 0].sigmoid().tolist()
    return logits_BL.softmax(-1)[:, -1].tolist()


class ClassifierReward(LearnedReward):
    """A reward model's score as the reward (see the module docstring).

    ``verifier`` (a verifiable reward), when given, sets ``format_acc``, ``ans_acc`` and
    ``parsed``, so training metrics show true accuracy while the reward is the model's score
    alone; without it the accuracy is the score clipped to [0, 1].
    """

    name = "reward_model"

    def __init__(
        self,
        scorer: PairScorer,
        *,
        timeout_s: float = 60.0,
        verifier: RewardFunction | None = None,
        label: str = "reward_model",
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"{label}: timeout_s must be > 0, got {timeout_s}")
        super().__init__(
            timeout_s=timeout_s,
            verifier=verifier,
            thread_name="reward-model",
        )
        self.scorer = scorer
        self.name = label

    def score_responses(self, batch: RewardBatch) -> list[RewardResult]:
        prompts = [list(_messages(e)) for e in batch.examples]
        responses = list(batch.responses)
        scores = self.within_deadline(
            lambda: self._checked_scores(prompts, responses), len(responses), "scores"
        )
        if scores is None:
            failed = {"reward_error": self.last_error}
            return self.results([None] * len(responses), batch, [failed] * len(responses))
        return self.results(scores, batch, [{} for _ in scores])

    def _checked_scores(self, prompts: list[Messages], responses: list[str]) -> list[float]:
        """The scorer's scores, checked: one finite number per response."""
        scores = [float(s) for s in self.scorer.score(prompts, responses)]
        if len(scores) != len(responses) or not all(math.isfinite(s) for s in scores):
            raise ValueError(f"scorer returned {scores!r} for {len(responses)} responses")
        return scores


@register_reward("reward_model")
def local_reward_model(
    path: str,
    *,
    tokenizer_path: str | None = None,
    batch_size: int = 16,
    max_length: int = 512,
    normalize: Literal["none", "sigmoid"] = "sigmoid",
    timeout_s: float = 60.0,
    verifier: str | None = None,
) -> ClassifierReward:
    """A reward model loaded in this process from the local directory ``path`` (how
    ``reward.extra`` entries of type ``reward_model`` are built)."""
    scorer = RewardModelScorer(
        path,
        tokenizer_dir=tokenizer_path,
        batch_size=batch_size,
        max_length=max_length,
        normalize=normalize,
    )
    return ClassifierReward(
        scorer,
        timeout_s=timeout_s,
        verifier=build_reward(verifier) if verifier is not None else None,
    )


def _messages(example: Example) -> Sequence[Mapping[str, Any]]:
    messages = example.get("messages") if isinstance(example, Mapping) else None
    return messages if isinstance(messages, list) else []
