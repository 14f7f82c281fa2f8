"""A tiny Llama-type GGUF file written with the ``gguf`` package, for the GGUF source's tests: a
byte-level BPE vocabulary (256 byte units, two merges, two control tokens), a ChatML-like chat
template and random float32 tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_units() -> list[str]:
    """The printable character GPT-2's byte-level BPE spells each byte 0..255 with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    units, shifted = [], 0
    for b in range(256):
        if b in printable:
            units.append(chr(b))
        else:
            units.append(chr(256 + shifted))
            shifted += 1
    return units


def write_tiny_gguf(
    path: Path, *, hidden: int = 16, layers: int = 2, heads: int = 2, ffn: int = 32, seed: int = 0
) -> dict[str, np.ndarray]:
    """Write the file; returns its tensors by GGUF name."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = [*byte_units(), "Ġt", "he", "<|im_start|>", "<|im_end|>"]
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 2) + [3, 3])  # 3: control tokens
    writer.add_token_merges(["Ġ t", "h e"])
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(vocab - 1)
    writer.add_pad_token_id(vocab - 1)
    writer.add_chat_template(CHAT_TEMPLATE)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    tensors = {
        "token_embd.weight": rand(vocab, hidden),
        "output_norm.weight": np.ones(hidden, np.float32),
        "output.weight": rand(vocab, hidden),
    }
    for i in range(layers):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = np.ones(hidden, np.float32)
        tensors[p + "ffn_norm.weight"] = np.ones(hidden, np.float32)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[p + name + ".weight"] = rand(hidden, hidden)
        tensors[p + "ffn_gate.weight"] = rand(ffn, hidden)
        tensors[p + "ffn_up.weight"] = rand(ffn, hidden)
        tensors[p + "ffn_down.weight"] = rand(hidden, ffn)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors
