"""Which layer types zbrl runs, read from a model's config before any run directory exists.

transformers names each decoder layer's kind in ``config.layer_types`` (a model without it has
full attention everywhere):

- ``full_attention``: keys and values in the cache; every layout runs it, packing included
  (the block-causal 4-D mask keeps packed samples apart).
- ``sliding_attention`` (GPT-OSS, Gemma) and ``chunked_attention`` (Llama 4): keys and values
  of a window or a chunk. Generation, full rows and shared prompts run them; packing does not:
  the packed layout's 4-D mask replaces the one transformers builds, window included, so a
  token would see keys beyond its window.
- ``linear_attention`` (Qwen3.5, Qwen3-Next: gated delta-net layers): a convolution state and
  a recurrent state in place of keys and values. Generation, full rows and shared prompts run
  it (the state is repeated or selected per row, :mod:`zbrl.models.kv_cache`); packing does
  not: such a layer reads no 4-D mask and carries its state along the packed row, so each
  packed sample would continue the previous one's state.

Any other layer type is refused, naming it.
"""

from __future__ import annotations

from pathlib import Path

from zbrl.errors import RunError

RUNS = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")
"""Layer types zbrl runs (generation, full rows, shared prompts)."""
PACKS = ("full_attention",)
"""Layer types the packed layout is correct for."""
WHY_NOT_PACKED = {
    "sliding_attention": "its attention window is not part of the packed block-causal mask, "
    "so a token would see keys beyond its window",
    "chunked_attention": "its attention chunks are not part of the packed block-causal mask, "
    "so a token would see keys outside its chunk",
    "linear_attention": "it reads no attention mask and carries its recurrent state along the "
    "packed row, so each packed sample would continue the previous one's state",
}


def layer_types_of(config: object) -> list[str]:
    """The decoder's layer types (the text model's for a multimodal config); all
    ``full_attention`` when the config names none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types:
        return list(types)
    return ["full_attention"] * int(getattr(text, "num_hidden_layers", 0) or 0)


def check_layer_types(types: list[str], *, packing: bool, where: str) -> None:
    """A RunError naming the first layer type zbrl does not run (or, with ``packing``, does
    not pack) and the fix; ``where`` names the model (``model.path=...``)."""
    for kind in dict.fromkeys(types):
        layers = [i for i, t in enumerate(types) if t == kind]
        if kind not in RUNS:
            raise RunError(
                f"{where}: its layers {_span(layers)} are {kind!r}, a layer type zbrl does not "
                f"run (it runs {', '.join(RUNS)}); use a model of those layer types"
            )
        if packing and kind not in PACKS:
            raise RunError(
                f"{where}: training.packing=true, but its layers {_span(layers)} are {kind!r}: "
                f"{WHY_NOT_PACKED[kind]}; set training.packing=false (shared prompts run each "
                "prompt once without packing)"
            )


def check_model_layers(
    model_dir: Path, *, packing: bool, where: str, trust_remote_code: bool = False
) -> list[str]:
    """:func:`check_layer_types` on the config in ``model_dir``; returns the layer types."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    types = layer_types_of(config)
    check_layer_types(types, packing=packing, where=where)
    return types


def _span(layers: list[int]) -> str:
    shown = ", ".join(str(i) for i in layers[:6])
    return shown + (f", ... ({len(layers)} layers)" if len(layers) > 6 else "")
