"""A model's shape for the memory plan, read without loading any weight.

Where the shape comes from, in this order (:func:`model_shape`):

- ``model.path: embedded``: the tiny model's ``LlamaConfig``, built from the embedded tokenizer
  and the warm start's size settings
  (:meth:`zbrl.embedded.warm_start.WarmStartSettings.model_config`);
- a local model directory (or one given by the caller, e.g. a Hub id the pre-flight fetched):
  its ``config.json``;
- a pulled model's short name (``smollm2-135m``): ``config.json`` of the directory
  ``zbrl models pull`` made;
- a Hub id already in huggingface_hub's local cache: that ``config.json`` (looked up offline);
- otherwise a Hub id, or a path whose last component is such a model's name
  (``/models/Qwen2.5-7B``), found in :data:`KNOWN_SHAPES`: public figures from each model's
  ``config.json`` on the Hub, so that a machine without the model (or without a hub) can plan
  for it. The plan then says the shape came from that table.

The parameter count is computed from the shape (:attr:`ModelShape.params`): embeddings, per
decoder layer the attention projections (with Qwen2's q/k/v biases, Qwen3's q/k norms), the
gated MLP's three matrices and two RMSNorms, the final norm, and an untied ``lm_head``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zbrl.config import EMBEDDED, RunConfig
from zbrl.errors import RunError


class ShapeUnknown(RunError):
    """No shape for a model that is not on this machine and not in :data:`KNOWN_SHAPES`."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory plan needs of a decoder-only transformer."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool = False
    """Biases on the q, k and v projections (Qwen2)."""
    qk_norm: bool = False
    """RMSNorms on each head's queries and keys (Qwen3)."""
    source: str = ""
    """Where the shape was read, for the plan's output."""
    attention_gate: bool = False
    """The query projection also gives a per-channel output gate (twice as wide: Qwen3.5 and
    Qwen3-Next full-attention layers)."""
    out_bias_and_sinks: bool = False
    """A bias on the output projection and one attention-sink logit per head (GPT-OSS)."""
    experts: int = 0
    """Routed experts per MoE layer (0: a dense model)."""
    experts_per_token: int = 0
    """Experts each token is routed to (the active ones)."""
    expert_intermediate: int = 0
    """Each expert's gated-MLP width."""
    shared_expert_intermediate: int = 0
    """Width of the shared expert every token also runs, with its one-output gate (Qwen3-Next;
    0: none)."""
    expert_bias: bool = False
    """Biases on the router and the experts' projections (GPT-OSS)."""
    dense_layers: int = 0
    """Layers of an MoE model whose MLP is dense (``intermediate`` wide)."""
    linear_layers: int = 0
    """Linear-attention (gated delta-net) layers: a convolution and a recurrent state per
    sequence in place of keys and values (Qwen3.5, Qwen3-Next)."""
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv_kernel: int = 0

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def summary(self) -> str:
        """The shape in a few words: layers, hidden size, vocabulary, and where they apply the
        experts (total / active parameters) and the linear-attention layers."""
        parts = [f"{self.layers} layers", f"hidden {self.hidden}", f"vocab {self.vocab}"]
        if self.experts:
            parts.append(
                f"{self.experts} experts, {self.experts_per_token} active: "
                f"{self.active_params / 1e9:.3f}B active parameters"
            )
        if self.linear_layers:
            parts.append(f"{self.linear_layers} linear-attention layers")
        return ", ".join(parts)

    @property
    def attention_layers(self) -> int:
        """Layers that keep keys and values (every layer but the linear-attention ones)."""
        return self.layers - self.linear_layers

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def attention_params(self) -> int:
        """A full-attention mixer: q (+ gate), k, v, o projections, their biases, q/k norms."""
        h, q, kv = self.hidden, self.q_width, self.kv_width
        attention = h * q * (2 if self.attention_gate else 1) + 2 * h * kv + q * h
        if self.qkv_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        if self.out_bias_and_sinks:
            attention += h + self.heads
        return attention

    @property
    def linear_conv_channels(self) -> int:
        """Channels of a linear-attention layer's convolution (queries, keys, values)."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim

    @property
    def linear_attention_params(self) -> int:
        """A gated delta-net mixer: input projections to q, k, v, the output gate z and the
        per-head b, a; the depthwise convolution over q, k, v; per-head ``dt_bias``, ``A_log``;
        the gated norm; the output projection."""
        h, nv = self.hidden, self.linear_v_heads
        vd = nv * self.linear_v_dim
        conv = self.linear_conv_channels
        projections = h * (conv + vd + 2 * nv) + vd * h
        return projections + conv * self.linear_conv_kernel + 2 * nv + self.linear_v_dim

    def expert_params(self, experts: int) -> int:
        """An MoE block with ``experts`` of its routed experts counted (all of them: the
        weights; ``experts_per_token``: what a token runs), its router and shared expert."""
        h, e = self.hidden, self.expert_intermediate
        routed = 3 * h * e + ((2 * e + h) if self.expert_bias else 0)
        router = self.experts * h + (self.experts if self.expert_bias else 0)
        shared = (
            3 * h * self.shared_expert_intermediate + h if self.shared_expert_intermediate else 0
        )
        return experts * routed + router + shared

    def _layers_params(self, experts: int) -> int:
        mixers = (
            self.attention_layers * self.attention_params
            + self.linear_layers * self.linear_attention_params
        )
        dense = (self.layers - self.moe_layers) * 3 * self.hidden * self.intermediate
        moe = self.moe_layers * self.expert_params(experts) if self.experts else 0
        return mixers + dense + moe + self.layers * 2 * self.hidden

    @property
    def layer_params(self) -> int:
        """The largest decoder layer (what FSDP2 gathers one at a time): its mixer
        (attention or linear attention), its MLP (dense or MoE, every expert), two RMSNorms."""
        mixer = self.attention_params if self.attention_layers else self.linear_attention_params
        if self.linear_layers and self.attention_layers:
            mixer = max(mixer, self.linear_attention_params)
        mlp = 3 * self.hidden * self.intermediate if self.moe_layers < self.layers else 0
        if self.experts:
            mlp = max(mlp, self.expert_params(self.experts))
        return mixer + mlp + 2 * self.hidden

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: all of a dense model's, an MoE model's with
        ``experts_per_token`` of its routed experts (the compute per token, not the memory)."""
        return self._layers_params(self.experts_per_token or self.experts) + self.root_params

    @property
    def mlp_intermediate(self) -> int:
        """The MLP width a token runs through in the widest layer (active experts and shared
        expert of an MoE layer): what its activations scale with."""
        if not self.experts:
            return self.intermediate
        moe = self.experts_per_token * self.expert_intermediate + self.shared_expert_intermediate
        return max(moe, self.intermediate if self.dense_layers else 0)

    @property
    def linear_state_elements(self) -> int:
        """One sequence's state in one linear-attention layer: the convolution's last
        ``linear_conv_kernel`` inputs and the per-head ``k_dim × v_dim`` recurrent state."""
        conv = self.linear_conv_channels * self.linear_conv_kernel
        return conv + self.linear_v_heads * self.linear_k_dim * self.linear_v_dim

    @property
    def root_params(self) -> int:
        """Everything outside the decoder layers: embeddings, final norm, an untied head."""
        head = 0 if self.tie_embeddings else self.embedding_params
        return self.embedding_params + self.hidden + head

    @property
    def params(self) -> int:
        """Every parameter (every expert of an MoE model: the weights held in memory)."""
        return self._layers_params(self.experts) + self.root_params

    @property
    def matrix_params(self) -> int:
        """Parameters a linear layer multiplies with: every one but the input embedding's
        (an embedding lookup is not cast by autocast) unless the head shares it."""
        return self.params - (0 if self.tie_embeddings else self.embedding_params)

    def lora_params(self, rank: int, target_modules: list[str]) -> int:
        """Adapter parameters of rank ``rank`` on the named linear layers of every decoder
        layer: ``rank × (in + out)`` each."""
        h, q, kv, i = self.hidden, self.q_width, self.kv_width, self.intermediate
        shapes = {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        per_layer = sum(rank * sum(shapes[m]) for m in target_modules if m in shapes)
        return self.layers * per_layer


def shape_from_config(config: dict[str, Any], source: str) -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` (a multimodal model's
    ``text_config``)."""
    config = config.get("text_config", config)
    try:
        heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        head_dim = config.get("head_dim") or hidden // heads
        model_type = config.get("model_type", "")
        qkv_bias = config.get("attention_bias")
        return ModelShape(
            layers=config["num_hidden_layers"],
            hidden=hidden,
            intermediate=config["intermediate_size"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            vocab=config["vocab_size"],
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" if qkv_bias is None else bool(qkv_bias),
            qk_norm=model_type.startswith("qwen3"),
            source=source,
            attention_gate=model_type.startswith(("qwen3_next", "qwen3_5")),
            out_bias_and_sinks=model_type == "gpt_oss",
            **_moe_fields(config, model_type),
            **_linear_fields(config),
        )
    except KeyError as exc:
        raise RunError(
            f"{source} has no {exc.args[0]!r}: the memory plan reads decoder-only transformer "
            "configs (num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, "
            "vocab_size)"
        ) from None


def layer_types(config: dict[str, Any]) -> list[str]:
    """The layer types a ``config.json`` names (``full_attention_interval``: every n-th layer
    full attention, the others linear), all full attention when it names none."""
    layers = config["num_hidden_layers"]
    if config.get("layer_types"):
        return list(config["layer_types"])
    interval = config.get("full_attention_interval")
    if interval:
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)
        ]
    return ["full_attention"] * layers


def _moe_fields(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The MoE fields of :class:`ModelShape` from a ``config.json`` (none for a dense model):
    Qwen3-MoE / Qwen3-Next name the expert width ``moe_intermediate_size`` and may keep some
    layers dense (``mlp_only_layers``, ``decoder_sparse_step``); GPT-OSS's experts are
    ``intermediate_size`` wide."""
    experts = config.get("num_experts") or config.get("num_local_experts") or 0
    if not experts:
        return {}
    layers = config["num_hidden_layers"]
    step = config.get("decoder_sparse_step") or 1
    dense_only = set(config.get("mlp_only_layers") or [])
    dense = sum(1 for i in range(layers) if i in dense_only or (i + 1) % step != 0)
    return {
        "experts": experts,
        "experts_per_token": config.get("num_experts_per_tok") or 1,
        "expert_intermediate": config.get("moe_intermediate_size") or config["intermediate_size"],
        "shared_expert_intermediate": config.get("shared_expert_intermediate_size") or 0,
        "expert_bias": model_type == "gpt_oss",
        "dense_layers": dense,
    }


def _linear_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The linear-attention fields of :class:`ModelShape` (none without such layers)."""
    linear = layer_types(config).count("linear_attention")
    if not linear:
        return {}
    return {
        "linear_layers": linear,
        "linear_k_heads": config["linear_num_key_heads"],
        "linear_v_heads": config["linear_num_value_heads"],
        "linear_k_dim": config["linear_key_head_dim"],
        "linear_v_dim": config["linear_value_head_dim"],
        "linear_conv_kernel": config["linear_conv_kernel_dim"],
    }


KNOWN_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-0.5B": ModelShape(24, 896, 4864, 14, 2, 64, 151936, True, qkv_bias=True),
    "Qwen/Qwen2.5-1.5B": ModelShape(28, 1536, 8960, 12, 2, 128, 151936, True, qkv_bias=True),
    "Qwen/Qwen2.5-7B": ModelShape(28, 3584, 18944, 28, 4, 128, 152064, False, qkv_bias=True),
    "Qwen/Qwen3-0.6B": ModelShape(28, 1024, 3072, 16, 8, 128, 151936, True, qk_norm=True),
}
"""Public shapes (from each model's ``config.json`` on the Hugging Face Hub): layers, hidden,
intermediate, heads, kv heads, head dim, vocabulary, tied embeddings. An ``-Instruct`` model has
its base's shape."""


def known_shape(spec: str) -> ModelShape | None:
    """The table's shape for a Hub id or a path ending in a known model's name (its
    ``-Instruct`` variant included), case-insensitively; None when it has none."""
    name = spec.rstrip("/").rsplit("/", 1)[-1].lower().removesuffix("-instruct")
    for repo_id, shape in KNOWN_SHAPES.items():
        if repo_id.rsplit("/", 1)[-1].lower() == name:
            return replace(shape, source=f"zbrl's table of known shapes ({repo_id})")
    return None


def embedded_shape() -> ModelShape:
    """The embedded tiny model's shape (its tokenizer is built: milliseconds, no weights)."""
    from zbrl.embedded.tokenizer import build_tokenizer
    from zbrl.embedded.warm_start import WarmStartSettings

    config = WarmStartSettings().model_config(build_tokenizer())
    return shape_from_config(config.to_dict(), "the embedded model's config")


def local_config(spec: str, cache_dir: str) -> Path | None:
    """``config.json`` of ``spec`` when it is on this machine (a directory, a pulled model, a
    Hub id in huggingface_hub's cache); None otherwise."""
    from zbrl.models import catalogue, hub

    path = Path(spec).expanduser()
    if path.is_dir():
        return path / "config.json"
    if spec in catalogue.KNOWN_MODELS:
        pulled = catalogue.model_dir(spec, cache_dir) / "config.json"
        return pulled if pulled.is_file() else None
    if hub.looks_like_hub_id(spec):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(spec, "config.json")
        return Path(cached) if isinstance(cached, str) else None
    return None


def read_shape(
    spec: str, cache_dir: str, *, field: str, model_dir: Path | None = None
) -> ModelShape:
    """The shape of the model ``field=spec`` names (``model_dir``: its resolved directory, when
    the caller has it). ShapeUnknown when there is none to be had without a download."""
    if spec == EMBEDDED:
        return embedded_shape()
    config = model_dir / "config.json" if model_dir is not None else local_config(spec, cache_dir)
    if config is not None:
        if not config.is_file():
            raise RunError(f"{field}={spec!r}: {config} does not exist; give a model directory")
        return shape_from_config(json.loads(config.read_text()), str(config))
    shape = known_shape(spec)
    if shape is None:
        known = ", ".join(KNOWN_SHAPES)
        raise ShapeUnknown(
            f"{field}={spec!r} is not on this machine and its shape is not in zbrl's table "
            f"({known}); fetch it first (`zbrl models pull`, `hf download`) or point {field} at "
            "a directory with its config.json"
        )
    return shape


def model_shape(cfg: RunConfig, model_dir: Path | None = None) -> ModelShape:
    """The policy's shape (``model.path``)."""
    return read_shape(
        cfg.model.path, cfg.logging.cache_dir, field="model.path", model_dir=model_dir
    )
