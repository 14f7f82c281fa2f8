"""Generation with transformers ``generate``: works on CPU and GPU, batched, variable lengths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zbrl.config.rollout import BackendCapabilities
from zbrl.config.rollout import TransformersBackend as TransformersOptions
from zbrl.models.forward import score_rows
from zbrl.models.kv_cache import cache_argument, left_pad, prompt_head_cache, repeat_cache_rows
from zbrl.models.moe import forward_kwargs
from zbrl.rollout.backends.base import Completion, SamplingParams, grouped, positions_of
from zbrl.rollout.backends.transformers.fast_decode import FastDecoder, unsupported
from zbrl.rollout.backends.transformers.inflight import ChunkedGeneration
from zbrl.rollout.backends.transformers.responses import ResponseRule, sampled_logprobs

if TYPE_CHECKING:
    from zbrl.models.lora import AdapterMerger


def fast_decode_device_off(device: torch.device) -> str | None:
    """Why zbrl's own decode loop is not used on ``device`` (None: it is): it has been checked
    against ``generate`` on the CPU only; on a GPU it waits for bench/gpu_check.py to pass."""
    if device.type == "cpu":
        return None
    return f"device {device.type} (zbrl's loop is checked on the CPU only: bench/gpu_check.py)"


class TransformersBackend:
    """Batched sampling with ``model.generate``; log-probs come from the raw logits of each step.
    With several samples per prompt, each prompt is prefilled once and its cache shared by its
    samples (:meth:`_prefill_once`). Where a response ends: :class:`.responses.ResponseRule`.

    A Llama-type model on the CPU is decoded by zbrl's own loop instead (:mod:`.fast_decode`:
    the same samples, a fraction of ``generate``'s overhead) unless ``fast_decode`` is off, the
    model is of another kind or on a GPU (``fast_decode_off`` says why) or the sampling has stop
    strings.

    With a ``merger`` (LoRA runs, :class:`zbrl.models.lora.AdapterMerger`) the weights it is sent
    are adapters, merged into the model from an unmerged copy of its base.
    """

    capabilities: ClassVar[BackendCapabilities] = TransformersOptions.capabilities
    """What it can do: declared by its config variant (``rollout.backend.type=transformers``)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        device: str | torch.device = "cpu",
        merger: AdapterMerger | None = None,
        fast_decode: bool = True,
    ) -> None:
        self.model = model.to(device).eval()
        self.context_len = positions_of(model.config)
        self.merger = merger
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        if tokenizer.pad_token_id is not None:
            self.pad_id = tokenizer.pad_token_id
        else:
            self.pad_id = next(iter(self.eos_ids))
        self.responses = ResponseRule(tokenizer, self.eos_ids, self.pad_id)
        self.fast_decode_off = (
            "fast_decode=False"
            if not fast_decode
            else (fast_decode_device_off(self.device) or unsupported(model))
        )
        """Why ``generate`` calls transformers' ``generate`` (None: zbrl's loop decodes)."""
        self.decoder = FastDecoder(model) if self.fast_decode_off is None else None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions per prompt, each in one ``generate`` call."""
        if not prompts:
            return []
        if self.decoder is not None and not params.stop_strings:
            completions = self._decode_fast(self.decoder, prompts, params)
        else:
            input_ids, attention, kwargs = self._prefilled(prompts, params)
            completions = self._generate_once(input_ids, attention, kwargs, params)
        return grouped(completions, params.n, greedy=params.temperature == 0)

    @torch.no_grad()
    def start(
        self, prompts: list[list[int]], params: SamplingParams, version: int, keep_cache: bool
    ) -> ChunkedGeneration:
        """A generation in chunks that its caller advances, with new weights possible between
        chunks (:mod:`zbrl.rollout.backends.transformers.inflight`)."""
        input_ids, attention, kwargs = self._prefilled(prompts, params)
        per_prompt = kwargs["num_return_sequences"]
        if per_prompt > 1:  # one-token prompts: no prefill to share
            input_ids = input_ids.repeat_interleave(per_prompt, dim=0)
            attention = attention.repeat_interleave(per_prompt, dim=0)
            kwargs["num_return_sequences"] = 1
        return ChunkedGeneration(
            self.model, self.responses, params, input_ids, attention, kwargs, version, keep_cache
        )

    def _prefilled(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """The left-padded prompts, their attention mask and ``generate``'s arguments, each
        prompt prefilled once for its samples where it has more than one token."""
        input_ids, attention = self._left_pad(prompts)
        greedy = params.temperature == 0
        # greedy decoding gives the same answer n times: decode once, copy (transformers refuses
        # num_return_sequences > 1 without sampling)
        per_prompt = 1 if greedy else params.n
        kwargs = {
            "max_new_tokens": params.max_new_tokens,
            "num_return_sequences": per_prompt,
            "do_sample": not greedy,
            "return_dict_in_generate": True,
            "output_logits": True,
            "pad_token_id": self.pad_id,
            "eos_token_id": sorted(self.eos_ids),
            **forward_kwargs(self.model),  # an MoE model's router loss: off in generation
        }
        if not greedy:
            kwargs.update(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else 0,
            )
        if params.stop_strings:
            kwargs.update(stop_strings=list(params.stop_strings), tokenizer=self.tokenizer)
        if per_prompt > 1 and input_ids.shape[1] > 1:
            input_ids, attention = self._prefill_once(input_ids, attention, per_prompt, kwargs)
        return input_ids, attention, kwargs

    def _generate_once(
        self,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        kwargs: dict,
        params: SamplingParams,
    ) -> list[Completion]:
        """One ``generate`` call for the whole response (no weight swap inside)."""
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        new_tokens_NL = out.sequences[:, input_ids.shape[1] :].cpu()
        logits_LNV = torch.stack(out.logits, dim=0) if out.logits else None
        return self._completions(new_tokens_NL, logits_LNV, params)

    def _decode_fast(
        self, decoder: FastDecoder, prompts: list[list[int]], params: SamplingParams
    ) -> list[Completion]:
        """The completions of one ``decoder`` call (greedy: one per prompt, as ``generate``
        gives them)."""
        input_ids, attention = self._left_pad(prompts)
        new_tokens_NL, logits_LNV = decoder.decode(
            input_ids, attention, params, self.eos_ids, self.pad_id
        )
        return self._completions(new_tokens_NL.cpu(), logits_LNV, params)

    def _completions(
        self, new_tokens_NL: torch.Tensor, logits_LNV: torch.Tensor | None, params: SamplingParams
    ) -> list[Completion]:
        """Each row's completion: its sampled tokens' log-probs, cut where it ends."""
        temperature = 1.0 if params.temperature == 0 else params.temperature
        logprobs_NL = sampled_logprobs(logits_LNV, new_tokens_NL, temperature)
        completions = []
        for tokens, logprobs in zip(new_tokens_NL, logprobs_NL, strict=True):
            length, stopped = self.responses.end(tokens, params.stop_strings)
            completions.append(self.responses.completion(tokens, logprobs, length, stopped))
        return completions

    def _prefill_once(
        self, input_ids: torch.Tensor, attention: torch.Tensor, n: int, kwargs: dict
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run each prompt but its last token through the model once and hand ``generate`` the
        cache repeated for the ``n`` samples (instead of ``num_return_sequences=n``, which runs
        every prompt n times): ``generate`` then starts at the last prompt token. The samples
        are the same (same logits, same random draws); the prompt's work is done once."""
        cache = prompt_head_cache(self.model, input_ids, attention)
        repeat_cache_rows(cache, n)
        kwargs.update(num_return_sequences=1, **{cache_argument(self.model): cache})
        return input_ids.repeat_interleave(n, dim=0), attention.repeat_interleave(n, dim=0)

    def score_exact(
        self,
        rows: list[tuple[list[int], torch.Tensor]],
        *,
        temperature: float,
        dtype: torch.dtype,
        chunk_size: int,
    ) -> list[torch.Tensor]:
        """The response tokens' log-probs of each (prompt ids, response ids) row as the trainer
        computes them for a micro-batch of these rows, padded with this backend's pad id
        (capability ``exact_logprobs``: :func:`zbrl.models.forward.score_rows` on its model)."""
        return score_rows(
            self.model,
            rows,
            pad_id=self.pad_id,
            temperature=temperature,
            device=self.device,
            dtype=dtype,
            chunk_size=chunk_size,
        )

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        if self.merger is not None:
            self.merger.apply(named_tensors)
        else:
            self.model.load_state_dict(dict(named_tensors), strict=True)

    def release_memory(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = left_pad(prompts, self.pad_id)
        return ids.to(self.device), mask.to(self.device)
