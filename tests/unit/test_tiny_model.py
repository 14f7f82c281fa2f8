"""The embedded tiny model and tokenizer: saved and loaded exactly like a user's model directory."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from zbrl.embedded.addition_task import make_arithmetic_rows, reference_completion
from zbrl.embedded.tiny_model import build_tiny_model, create_embedded_model, tiny_model_config
from zbrl.embedded.tokenizer import EOS_TOKEN, ROLE_TOKENS, TAG_TOKENS, build_tokenizer
from zbrl.embedded.warm_start import (
    MARKER,
    WarmStartSettings,
    ensure_warm_start,
    read_warm_start_summary,
)
from zbrl.embedded.warm_start_tasks import AdditionWarmStart


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return create_embedded_model(tmp_path_factory.mktemp("embedded") / "model", seed=0)


def _task_texts(tokenizer) -> list[str]:
    texts = []
    for row in make_arithmetic_rows(20, seed=0, max_digits=3):
        completion = reference_completion(row)
        conversation = [*row["messages"], {"role": "assistant", "content": completion}]
        texts.append(tokenizer.apply_chat_template(conversation, tokenize=False))
        texts.append(completion)
        texts += [m["content"] for m in row["messages"]]
    return [*texts, "Mixed: 12 + 3 = 15.\nAnd ~`{}`!", " leading and trailing spaces  "]


def _ids(encoded) -> list[int]:
    """``apply_chat_template(tokenize=True)`` returns ids or a BatchEncoding across versions."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_token_ids_round_trip_through_save_and_from_pretrained(model_dir):
    built = build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(model_dir)
    assert len(loaded) == len(built)
    for text in _task_texts(built):
        before = built(text, add_special_tokens=False)["input_ids"]
        after = loaded(text, add_special_tokens=False)["input_ids"]
        assert after == before, text
        assert loaded.decode(after) == text
    # The digits are single characters: a number is spelled digit by digit, no merges.
    assert loaded.convert_ids_to_tokens(loaded("1234", add_special_tokens=False)["input_ids"]) == [
        "1",
        "2",
        "3",
        "4",
    ]


def test_tags_and_roles_are_single_tokens_and_tags_survive_skip_special_tokens(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    for token in [*TAG_TOKENS, *ROLE_TOKENS.values(), EOS_TOKEN]:
        ids = tok(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, token
    text = "<think>1+2=3</think><answer>3</answer>"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_saved_directory_is_a_llama_with_consistent_special_ids(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"  # not qwen2: docs/embedded-default.md
    generation = json.loads((model_dir / "generation_config.json").read_text())
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.eos_token == EOS_TOKEN
    assert generation["eos_token_id"] == tok.eos_token_id
    assert generation["pad_token_id"] == tok.pad_token_id
    assert tok.pad_token_id != tok.eos_token_id
    assert (model_dir / "model.safetensors").is_file()


def test_chat_template_appends_the_generation_prompt(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    messages = make_arithmetic_rows(1, seed=0)[0]["messages"]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    plain = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert prompt == plain + "<|assistant|>"
    assert prompt.startswith(tok.bos_token + "<|system|>" + messages[0]["content"] + EOS_TOKEN)
    assert "<|user|>" + messages[1]["content"] + EOS_TOKEN in prompt
    ids = _ids(tok.apply_chat_template(messages, add_generation_prompt=True))
    assert ids == tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.convert_ids_to_tokens(ids[-1]) == "<|assistant|>"
    # A finished assistant turn ends with the EOS token that generation stops at.
    full = tok.apply_chat_template(
        [*messages, {"role": "assistant", "content": "x"}], tokenize=False
    )
    assert full == plain + "<|assistant|>x" + EOS_TOKEN


def test_chat_template_rejects_unknown_roles(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    with pytest.raises(Exception, match="unknown chat role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_model_loads_with_auto_class_and_generates(model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert isinstance(model, LlamaForCausalLM)
    rows = make_arithmetic_rows(3, seed=0)
    prompts = [
        tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
        for r in rows
    ]
    enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    assert tok.padding_side == "left"
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, max_new_tokens=5)
    assert out.shape[0] == 3
    assert 0 < out.shape[1] - enc["input_ids"].shape[1] <= 5


def test_generation_stops_at_the_eos_token(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    messages = make_arithmetic_rows(1, seed=0)[0]["messages"]
    enc = tok(
        [tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)],
        add_special_tokens=False,
        return_tensors="pt",
    )
    prompt_len = enc["input_ids"].shape[1]
    everything = list(range(len(tok)))

    def force_eos_after_three(batch_id, ids):  # the model must stop on its own at EOS
        return [tok.eos_token_id] if len(ids) >= prompt_len + 3 else everything

    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=20,
            prefix_allowed_tokens_fn=force_eos_after_three,
        )
    response = out[0, prompt_len:].tolist()
    assert len(response) == 4
    assert response[-1] == tok.eos_token_id


def test_build_tiny_model_is_seeded_and_sized():
    tok = build_tokenizer()
    config = tiny_model_config(tok, hidden_size=64, num_layers=1, num_heads=2)
    a, b = build_tiny_model(config, seed=1), build_tiny_model(config, seed=1)
    c = build_tiny_model(config, seed=2)
    assert a.config.vocab_size == len(tok)
    assert a.config.hidden_size == 64 and a.config.num_hidden_layers == 1
    assert a.generation_config.eos_token_id == tok.eos_token_id
    assert a.generation_config.pad_token_id == tok.pad_token_id
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert any(not torch.equal(q, r) for q, r in zip(b.parameters(), c.parameters()))
    with pytest.raises(ValueError, match="divisible"):
        tiny_model_config(tok, hidden_size=30, num_heads=4)


def _warm_start(cache, **settings):
    """The addition task's warm start, without its held-out figures, quietly."""
    task = AdditionWarmStart(eval_size=0)
    return ensure_warm_start(cache, task, WarmStartSettings(**settings), verbose=False)


def test_warm_start_is_cached_by_its_settings(tmp_path):
    settings = {"n_train": 32, "batch_size": 4}
    first = _warm_start(tmp_path, seed=0, steps=2, **settings)
    assert (first / MARKER).is_file()
    assert read_warm_start_summary(first)["steps_trained"] == 2
    marker_mtime = (first / MARKER).stat().st_mtime_ns
    again = _warm_start(tmp_path, seed=0, steps=2, **settings)
    assert again == first and (first / MARKER).stat().st_mtime_ns == marker_mtime
    other = _warm_start(tmp_path, seed=0, steps=3, **settings)
    assert other != first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])
    model = AutoModelForCausalLM.from_pretrained(first)
    assert isinstance(model, LlamaForCausalLM)
    assert AutoTokenizer.from_pretrained(first).eos_token == EOS_TOKEN


def test_warm_start_without_marker_is_rebuilt(tmp_path):
    settings = {"n_train": 32, "batch_size": 4}
    built = _warm_start(tmp_path, seed=0, steps=1, **settings)
    (built / MARKER).unlink()  # as if interrupted before the marker was written
    rebuilt = _warm_start(tmp_path, seed=0, steps=1, **settings)
    assert rebuilt == built and (rebuilt / MARKER).is_file()
