"""In-flight weight updates for the transformers backend: generation in chunks, new weights
between chunks (docs/algorithms.md, In-flight weight updates).

Each chunk is one ``model.generate`` call of at most ``chunk_tokens`` new tokens that continues
the previous one from its key/value cache (the prompt and the tokens so far as ``input_ids``, the
cache covering all of them but the last), with the same logits processors, stopping criteria and
random draws as one long call: with no new version the tokens and log-probs are those of the
unchunked sampler. :class:`ChunkedGeneration` is the backend's stepping handle: its caller (the
producer, :func:`zbrl.rollout.inflight.generate_inflight`) advances it one chunk at a time and,
between chunks, loads a newer version if it has one and says so (``weights_loaded``).

After a swap the cache is **recomputed** under the new weights (AReaL's choice): one forward pass
over each sequence so far, so that every later token is sampled from the new policy given the
whole prefix, and its log-prob is that policy's own (what the trainer recomputes, what the
off-policy corrections divide by). ``keep_cache`` keeps the old cache instead
(PipelineRL's choice, ``rollout.inflight_updates.after_swap: keep``): no prefill, and later tokens
are sampled from a mixture (new weights over old keys and values) whose log-probs, recorded as
sampled, no single policy version gives.

Rows that ended in an earlier chunk (EOS or a stop string) stay ended: ``generate`` starts every
row as unfinished, so :class:`_RowEnds` stops them after one throw-away token (their response was
cut where it ended; what follows is never read). A response ends where ``generate`` ended it: its
first EOS, or the token on which transformers' stop-string rule matched (that rule also matches a
stop string that ends inside the last token, e.g. ``/`` in a ``</answer>`` token).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.generation.stopping_criteria import (
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

from zbrl.models.kv_cache import cache_argument, output_cache, prompt_head_cache
from zbrl.rollout.backends.base import Completion, SamplingParams, grouped
from zbrl.rollout.backends.transformers.responses import ResponseRule, sampled_logprobs


class _RowEnds(StoppingCriteria):
    """``generate``'s stopping rule for stop strings, with memory across chunks: rows that ended
    in an earlier chunk stop at once, and the response length at which each row's stop string
    first matched is recorded (``generate`` pads a row after that token)."""

    def __init__(self, rows: int, prompt_len: int, stop: StopStringCriteria | None) -> None:
        self.prompt_len = prompt_len
        self.stop = stop
        self.ended_N = torch.zeros(rows, dtype=torch.bool)
        """Rows that ended before the current chunk."""
        self.stop_len_N = torch.full((rows,), -1, dtype=torch.long)
        """Response length where a stop string first matched (-1: none yet)."""

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        done = self.ended_N.to(input_ids.device)
        if self.stop is None:
            return done
        fired = self.stop(input_ids, scores).cpu() & ~self.ended_N & (self.stop_len_N < 0)
        self.stop_len_N[fired] = input_ids.shape[1] - self.prompt_len
        return done | fired.to(input_ids.device)


class ChunkedGeneration:
    """One chunked generation of already expanded rows (one row per sample): the stepping handle
    (:class:`~zbrl.rollout.backends.base.GenerationHandle`) of the transformers backend."""

    def __init__(
        self,
        model: PreTrainedModel,
        responses: ResponseRule,
        params: SamplingParams,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        kwargs: dict[str, Any],
        version: int,
        keep_cache: bool,
    ) -> None:
        """``model`` generates the chunks of every row of ``input_ids``; ``responses``: where
        its responses end; ``kwargs``: the unchunked ``generate`` arguments,
        ``num_return_sequences=1``, possibly with a cache prefilled under the loaded weights,
        whose version is ``version``; ``keep_cache``: keep the cache after new weights."""
        self.model = model
        self.responses = responses
        self.params = params
        self.keep_cache = keep_cache
        self.temperature = 1.0 if params.temperature == 0 else params.temperature
        stops = list(params.stop_strings)
        stop = StopStringCriteria(responses.tokenizer, stops) if stops else None
        self.input_ids = input_ids
        self.attention = attention
        self.version = version
        self.rows = input_ids.shape[0]
        self.row_ends = _RowEnds(self.rows, input_ids.shape[1], stop)
        self.ends: list[int | None] = [None] * self.rows
        self.tokens: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []
        self.versions: list[torch.Tensor] = []
        self.kwargs = {k: v for k, v in kwargs.items() if k not in ("stop_strings", "tokenizer")}
        self.kwargs["stopping_criteria"] = StoppingCriteriaList([self.row_ends])
        self.remaining = params.max_new_tokens
        self.done = False

    @torch.no_grad()
    def advance(self, steps: int) -> None:
        """One ``generate`` call of at most ``steps`` new tokens, continuing from the cache."""
        out = self.model.generate(
            input_ids=self.input_ids,
            attention_mask=self.attention,
            **dict(self.kwargs, max_new_tokens=min(steps, self.remaining)),
        )
        new_NC = out.sequences[:, self.input_ids.shape[1] :]
        self.tokens.append(new_NC.cpu())
        logits_CNV = torch.stack(out.logits, dim=0)
        self.logprobs.append(sampled_logprobs(logits_CNV, self.tokens[-1], self.temperature))
        self.versions.append(torch.full(new_NC.shape, self.version, dtype=torch.long))
        self.remaining -= new_NC.shape[1]
        self.input_ids = out.sequences
        self.attention = torch.cat([self.attention, self.attention.new_ones(new_NC.shape)], dim=1)
        self._mark_ended(torch.cat(self.tokens, dim=1))
        if self.remaining <= 0 or bool(self.row_ends.ended_N.all()):
            self.done = True
            return
        self.kwargs[cache_argument(self.model)] = output_cache(out)

    @torch.no_grad()
    def weights_loaded(self, version: int) -> None:
        """Tag the next chunks with ``version`` and, unless ``keep_cache``, recompute the cache
        under the new weights."""
        if not self.keep_cache:
            cache = self._after_swap(self.input_ids, self.attention)
            self.kwargs[cache_argument(self.model)] = cache
        self.version = version

    def results(self) -> list[list[Completion]]:
        all_tokens = torch.cat(self.tokens, dim=1)
        all_logprobs = torch.cat(self.logprobs, dim=1)
        all_versions = torch.cat(self.versions, dim=1)
        done = [
            self._completion(all_tokens[i], all_logprobs[i], all_versions[i], self.ends[i])
            for i in range(self.rows)
        ]
        return grouped(done, self.params.n, greedy=self.params.temperature == 0)

    def close(self) -> None:
        """Nothing to release: the cache goes with the handle."""

    def _after_swap(self, input_ids: torch.Tensor, attention: torch.Tensor) -> Any:
        """The cache the next chunk continues from, after new weights were loaded: recomputed
        under them for every token but the last (which the next chunk feeds in)."""
        return prompt_head_cache(self.model, input_ids, attention)

    def _mark_ended(self, so_far_NL: torch.Tensor) -> None:
        """Record the response length of each row that ended in this chunk, as ``generate``
        ended it: at its first EOS (included) or where its stop string matched."""
        row_ends, ends = self.row_ends, self.ends
        eos = torch.tensor(sorted(self.responses.eos_ids))
        for i in (~row_ends.ended_N).nonzero().flatten().tolist():
            at_eos = torch.isin(so_far_NL[i], eos).nonzero().flatten()
            candidates = [int(at_eos[0]) + 1] if at_eos.numel() else []
            if row_ends.stop_len_N[i] >= 0:
                candidates.append(int(row_ends.stop_len_N[i]))
            if candidates:
                ends[i] = min(candidates)
                row_ends.ended_N[i] = True

    def _completion(
        self,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        versions: torch.Tensor,
        end: int | None,
    ) -> Completion:
        if end is None:  # ran to max_new_tokens
            length, stopped = self.responses.end(tokens, self.params.stop_strings)
        else:
            length, stopped = end, True
        return self.responses.completion(tokens, logprobs, length, stopped, versions)
