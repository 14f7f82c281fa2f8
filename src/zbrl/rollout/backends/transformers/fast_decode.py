"""zbrl's own sampling loop for Llama-type models: the same samples as transformers' ``generate``
at a fraction of its per-token overhead.

On a small model ``generate`` spends more time in Python than in arithmetic: each decode step
goes through transformers' module tree, its mask builders, its logits processors and stopping
criteria, and a ``DynamicCache`` that concatenates every layer's keys and values (the embedded
model: about 4.8 ms a step, half of it outside the kernels). :class:`FastDecoder` runs the same
arithmetic as transformers' Llama forward (the model's own weight tensors, so weights loaded into
the model are the weights it decodes with) as a flat sequence of tensor operations, over a
key/value cache allocated once for the whole response.

Sampling follows ``generate``'s rules step for step, so a seeded run draws the same tokens:

- scores: the step's logits, divided by the temperature (when it is not 1), then top-k (kept:
  the scores at least the k-th largest), then top-p (dropped: the ascending-sorted scores whose
  cumulative probability is at most 1 - p, the largest always kept);
- one ``torch.multinomial`` draw over every row of the batch per step, finished rows included,
  whose token is then replaced by the pad token (greedy: ``argmax``);
- a row finishes at its first EOS; the loop ends when every row has, or at ``max_new_tokens``.

Only the model's forward is replaced, and only where it is plain Llama arithmetic
(:func:`unsupported`): default RoPE, SiLU MLP, one tensor-parallel slice, and a generation config
that adds no logits processor ``generate`` would apply (a repetition penalty, say). Elsewhere the
backend calls ``generate`` as before. docs/performance.md, "Generation's own loop", has the
measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GenerationConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from zbrl.models.kv_cache import left_padded_positions
from zbrl.rollout.backends.base import SamplingParams

_ALLOWED_GENERATION_FIELDS = frozenset(
    {
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "decoder_start_token_id",
        "do_sample",
        "temperature",
        "top_p",
        "top_k",
        "max_length",
        "max_new_tokens",
        "transformers_version",
        "_from_model_config",
        "use_cache",
        "cache_implementation",
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "output_logits",
        "return_dict_in_generate",
        "num_return_sequences",
    }
)
"""Generation-config fields that change nothing the loop does: the sampling parameters it is
called with override them, and the rest name tokens, the cache or what ``generate`` returns."""

_NEUTRAL = {"repetition_penalty": 1.0, "num_beams": 1, "num_beam_groups": 1, "typical_p": 1.0,
            "length_penalty": 1.0, "diversity_penalty": 0.0}  # fmt: skip
"""Values of other fields that apply no processor either (a repetition penalty of 1)."""


def unsupported(model: PreTrainedModel) -> str | None:
    """Why :class:`FastDecoder` cannot decode ``model`` (None: it can)."""
    config = model.config
    if config.model_type != "llama":
        return f"model_type {config.model_type!r} (only 'llama' is decoded by zbrl's loop)"
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
    if rope.get("rope_type", "default") != "default":
        return f"rope_type {rope['rope_type']!r} (only the default RoPE)"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r} (only silu)"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias (biased MLP projections)"
    if getattr(config, "pretraining_tp", 1) != 1:
        return f"pretraining_tp {config.pretraining_tp}"
    if not hasattr(model, "model") or not hasattr(model.model, "layers"):
        return f"{type(model).__name__} has no model.layers"
    extra = _generation_fields(model.generation_config) - _ALLOWED_GENERATION_FIELDS
    if extra:
        return f"its generation config sets {sorted(extra)}"
    return None


def _generation_fields(config: GenerationConfig) -> set[str]:
    """The fields ``config`` sets to something other than off (None, False, empty) or neutral."""
    return {
        name
        for name, value in config.to_diff_dict().items()
        if value not in (None, False, [], {}) and _NEUTRAL.get(name, object()) != value
    }


class FastDecoder:
    """Decodes a transformers Llama model's continuations with a preallocated cache.

    It keeps references to the model's parameters, never copies: after ``load_state_dict`` (or
    an adapter merge) into the model it decodes with the new weights.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"FastDecoder cannot decode this model: {reason}")
        config = model.config
        self.model = model
        self.layers = list(model.model.layers)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.rotary = model.model.rotary_emb

    @torch.no_grad()
    def decode(
        self,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        params: SamplingParams,
        eos_ids: set[int],
        pad_id: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` continuations of each left-padded prompt (``input_ids``/``attention`` [B, P]),
        ``params.n`` of them, one when greedy (``temperature`` 0: ``generate`` gives one): the
        new tokens [B·n, L] (pad after a row's EOS; L ≤ ``params.max_new_tokens``, the steps
        run) and each step's raw logits [L, B·n, V] (float32, before any filter: what
        ``output_logits`` gives). Rows are prompt-major: prompt b's samples are rows b·n..b·n+n-1.
        ``params.stop_strings`` are not looked for (the backend sends those to ``generate``).
        """
        batch, width = input_ids.shape
        device = input_ids.device
        n = 1 if params.temperature == 0 else params.n
        max_new_tokens = params.max_new_tokens
        rows = batch * n
        total = width + max_new_tokens
        positions_BP = left_padded_positions(attention)
        rope = self._rope_tables(total, device)
        cache = _Cache.empty(self, rows, total, device)
        fused = [_FusedWeights.of(layer) for layer in self.layers]  # this call's weights

        # prefill: each prompt once, its keys/values repeated for its n samples
        prompt_mask = _prefill_mask(attention)
        logits_BV = self._forward(input_ids, positions_BP, rope, fused, prompt_mask, cache, n)
        logits_NV = logits_BV.repeat_interleave(n, dim=0) if n > 1 else logits_BV
        hidden_keys_NP = (attention == 0).repeat_interleave(n, dim=0)
        mask_NS = torch.zeros(rows, total, dtype=self.model.dtype, device=device)
        mask_NS[:, :width].masked_fill_(hidden_keys_NP, -float("inf"))
        next_positions_N = positions_BP[:, -1].repeat_interleave(n) + 1

        eos = torch.tensor(sorted(eos_ids), device=device)
        unfinished_N = torch.ones(rows, dtype=torch.bool, device=device)
        tokens, logits = [], []
        for step in range(max_new_tokens):
            logits.append(logits_NV)
            token_N = _choose(logits_NV, params)
            token_N = torch.where(unfinished_N, token_N, pad_id)
            tokens.append(token_N)
            unfinished_N &= ~torch.isin(token_N, eos)
            if step + 1 == max_new_tokens or not bool(unfinished_N.any()):
                break
            at = width + step
            mask_N11S = mask_NS[:, None, None, : at + 1]
            logits_NV = self._forward(
                token_N[:, None], next_positions_N[:, None] + step, rope, fused, mask_N11S,
                cache, 1, at,
            )  # fmt: skip
        return torch.stack(tokens, dim=1), torch.stack(logits, dim=0)

    def _rope_tables(self, total: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [total, head_dim] of positions 0..total-1, as the model's rotary
        embedding computes them."""
        positions = torch.arange(total, device=device)[None, :]
        probe = torch.empty(0, device=device, dtype=self.model.dtype)
        cos, sin = self.rotary(probe, positions)
        return cos[0], sin[0]

    def _forward(
        self,
        ids_BT: torch.Tensor,
        positions_BT: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        fused: list[_FusedWeights],
        mask: torch.Tensor,
        cache: _Cache,
        repeat: int,
        at: int = 0,
    ) -> torch.Tensor:
        """The last position's logits [B, V] (float32) of ``ids_BT`` at ``positions_BT`` (``rope``:
        :meth:`_rope_tables`; ``fused``: each layer's :class:`_FusedWeights`); their
        keys and values are written to ``cache`` at columns ``at``..``at+T-1``, each row
        ``repeat`` times (the prefill's samples). ``at`` 0 is the prefill, ``mask`` its boolean
        [B, 1, T, T]; later, one decode step (T = 1) and its additive float mask [N, 1, 1, at+1]
        over the cache."""
        batch, steps = ids_BT.shape
        base = self.model.model
        hidden = base.embed_tokens(ids_BT)
        cos_BTD, sin_BTD = rope[0][positions_BT], rope[1][positions_BT]
        width = self.heads * self.head_dim
        kv_width = self.kv_heads * self.head_dim
        for i, (layer, weights) in enumerate(zip(self.layers, fused, strict=True)):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            qkv = F.linear(x, weights.qkv, weights.qkv_bias)
            q, k, v = qkv.split((width, kv_width, kv_width), dim=-1)
            q = q.view(batch, steps, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, steps, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(batch, steps, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos_BTD, sin_BTD)
            if at == 0:  # prefill: attend within the prompt, store it for every sample
                cache.write(i, at, k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0))
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, scale=attn.scaling,
                    enable_gqa=self.kv_heads != self.heads,
                )  # fmt: skip
            else:
                cache.write(i, at, k, v)
                out = self._attend_one(q, *cache.upto(i, at + 1), mask, attn.scaling)
            out = out.transpose(1, 2).reshape(batch, steps, width)
            hidden = hidden + attn.o_proj(out)
            x = layer.post_attention_layernorm(hidden)
            gate, up = F.linear(x, weights.gate_up).chunk(2, dim=-1)
            hidden = hidden + layer.mlp.down_proj(F.silu(gate) * up)
        hidden = base.norm(hidden[:, -1])
        return self.model.lm_head(hidden).float()

    def _attend_one(
        self,
        q_NH1D: torch.Tensor,
        keys_NKSD: torch.Tensor,
        values_NKSD: torch.Tensor,
        mask_N11S: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """One query per row over the cache, [N, H, 1, D]: two matrix products and a softmax
        (for a single query about twice as fast on CPU as ``scaled_dot_product_attention``,
        whose kernels are built for blocks of queries). Query heads are grouped under their key
        head (head h reads key head h // (H / K)), so grouped-query attention needs no copy."""
        rows, heads, _, dim = q_NH1D.shape
        groups = heads // self.kv_heads
        q_NKGD = q_NH1D.reshape(rows, self.kv_heads, groups, dim)
        scores_NKGS = torch.matmul(q_NKGD, keys_NKSD.transpose(-1, -2)) * scale + mask_N11S
        out_NKGD = torch.matmul(scores_NKGS.softmax(dim=-1), values_NKSD)
        return out_NKGD.reshape(rows, heads, 1, dim)


@dataclass(frozen=True)
class _FusedWeights:
    """One layer's query/key/value projections as one matrix, and its gate and up projections
    as another (one matrix product each instead of three and two), concatenated from the
    model's weights at the start of every decode (so always its current ones)."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor

    @classmethod
    def of(cls, layer: torch.nn.Module) -> _FusedWeights:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat([p.bias for p in projections])
        return cls(
            torch.cat([p.weight for p in projections]),
            bias,
            torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
        )


class _Cache:
    """Every layer's keys and values for the whole decode, [N, kv_heads, total, head_dim]."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.keys = keys
        self.values = values

    @classmethod
    def empty(cls, decoder: FastDecoder, rows: int, total: int, device: torch.device) -> _Cache:
        shape = (rows, decoder.kv_heads, total, decoder.head_dim)
        dtype = decoder.model.dtype
        layers = range(len(decoder.layers))
        return cls(
            [torch.empty(shape, dtype=dtype, device=device) for _ in layers],
            [torch.empty(shape, dtype=dtype, device=device) for _ in layers],
        )

    def write(self, layer: int, at: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.keys[layer][:, :, at : at + k.shape[2]] = k
        self.values[layer][:, :, at : at + v.shape[2]] = v

    def upto(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


def _prefill_mask(attention_BP: torch.Tensor) -> torch.Tensor:
    """[B, 1, P, P] bool: causal, real keys only; a padding query sees itself (its output is
    never used, and a row with no key would make attention NaN)."""
    width = attention_BP.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=attention_BP.device).tril()
    mask = causal[None] & attention_BP.bool()[:, None, :]
    mask |= torch.eye(width, dtype=torch.bool, device=attention_BP.device)[None]
    return mask[:, None]


def _choose(logits_NV: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The next token of every row [N]: ``generate``'s warpers (a ``top_k`` of 0 or less and a
    ``top_p`` of 1 are off), then one multinomial draw per row (greedy: the argmax)."""
    if params.temperature == 0:
        return logits_NV.argmax(dim=-1)
    scores = logits_NV if params.temperature == 1.0 else logits_NV / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - params.top_p)
        drop_sorted[..., -1:] = False
        drop = drop_sorted.scatter(1, order, drop_sorted)
        scores = scores.masked_fill(drop, -float("inf"))
    probs = F.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)
