"""The embedded default's tokenizer: character level, built locally with ``tokenizers``.

Every printable ASCII character (plus space and newline) is one token, so numbers are spelled digit
by digit and ``decode(encode(text)) == text`` for any ASCII text. The reasoning/answer tags are
single added tokens, the chat roles have their own special tokens, and the end-of-turn token is the
EOS token that generation stops at.

The tokenizer is wrapped in :class:`transformers.PreTrainedTokenizerFast` and saved next to a
*Llama*-type model config. (transformers 5 loads a ``qwen2`` tokenizer through Qwen's own class,
which re-imposes Qwen's pre-tokenizer; with a Llama config ``tokenizer.json`` loads as built.)
"""

from __future__ import annotations

import string

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|end|>"
"""Closes every chat turn; generation stops here."""
UNK_TOKEN = "<|unk|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, *ROLE_TOKENS.values()]
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
"""Single (non-special) tokens: they survive ``decode(..., skip_special_tokens=True)``."""
ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role ' + message['role'] "
    "+ '; the embedded tokenizer knows system, user and assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
"""``<|bos|><|system|>…<|end|><|user|>…<|end|><|assistant|>`` — the generation prompt is the
assistant header; an assistant turn ends with the EOS token ``<|end|>``."""


def _build_backend() -> Tokenizer:
    vocab: dict[str, int] = {}
    for token in [*SPECIAL_TOKENS, *ALPHABET]:
        vocab[token] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Every character is its own pre-token; the WordLevel vocabulary maps it to one id.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return tok


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the embedded character-level tokenizer with its chat template.

    No BOS/EOS is added by ``tokenizer(text)``; the chat template writes them. Padding is on the
    left (decoder-only generation).
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=_build_backend(),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=512,
    )
