"""Encoded prompts cached across starts (zbrl.assembly.prompt_cache): a start with the same files
and settings takes them from the cache without loading the tokenizer; any change encodes again."""

from __future__ import annotations

import os
import shutil

import pytest

from zbrl import cli
from zbrl.assembly import model_source, prompt_cache
from zbrl.assembly.artifacts import prepare_artifacts
from zbrl.config import load_config
from zbrl.launch import inputs


@pytest.fixture
def start(tmp_path, tiny_model_dir, task_files):
    """(config, artifacts) of a start on copies of the task files, with ``overrides``."""
    train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    shutil.copy(task_files[0], train)
    shutil.copy(task_files[1], held_out)

    def make(*overrides: str):
        cfg = load_config(
            str(cli.DEMO_RECIPE),
            [
                f"model.path={tiny_model_dir}",
                f"data.train_path={train}",
                f"eval.sets={{heldout: {held_out}}}",
                f"logging.cache_dir={tmp_path / 'cache'}",
                *overrides,
            ],
        )
        return cfg, prepare_artifacts(cfg, verbose=False)

    make.train = train
    return make


@pytest.fixture
def tokenizer_loads(monkeypatch):
    """Counts the tokenizer loads (each one means the prompts were encoded)."""
    loads = []
    real = model_source.load_tokenizer

    def counting(cfg, tokenizer_dir):
        loads.append(tokenizer_dir)
        return real(cfg, tokenizer_dir)

    monkeypatch.setattr(model_source, "load_tokenizer", counting)
    return loads


def test_a_second_start_takes_the_encoded_prompts_from_the_cache(start, tokenizer_loads, capsys):
    cfg, artifacts = start()
    first_train, first_evals = inputs.encode_datasets(cfg, artifacts)
    assert len(tokenizer_loads) == 1
    second_train, second_evals = inputs.encode_datasets(cfg, artifacts)
    assert len(tokenizer_loads) == 1  # not loaded again
    assert second_train == first_train and second_evals == first_evals
    assert len(second_train) == 64 and len(second_evals["heldout"]) == 16
    out = capsys.readouterr().out
    assert out.count("[zbrl] train prompts: 64 (dropped 0") == 2
    assert "[zbrl] encoded prompts: reusing" in out


def test_a_changed_file_or_setting_encodes_again(start, tokenizer_loads):
    cfg, artifacts = start()
    first, _ = inputs.encode_datasets(cfg, artifacts)
    key = prompt_cache.cache_key(cfg, artifacts)
    cfg2, artifacts2 = start("data.max_prompt_tokens=20", "data.overlong_prompt=left_truncate")
    assert prompt_cache.cache_key(cfg2, artifacts2) != key
    changed, _ = inputs.encode_datasets(cfg2, artifacts2)
    assert len(tokenizer_loads) == 2
    assert [len(p.prompt_ids) for p in changed] == [20] * 64  # encoded with the new setting
    assert inputs.encode_datasets(cfg, artifacts)[0] == first  # the first entry is still there
    assert len(tokenizer_loads) == 2
    with start.train.open("a") as f:  # one more training line: another key, encoded again
        f.write(start.train.read_text().splitlines()[0] + "\n")
    assert prompt_cache.cache_key(cfg, artifacts) != key
    assert len(inputs.encode_datasets(cfg, artifacts)[0]) == 65
    assert len(tokenizer_loads) == 3


@pytest.mark.parametrize(
    "override", ["model.trust_remote_code=true", "reward.type=zbrl.rewards.boxed:BoxedReward"]
)
def test_what_the_key_cannot_see_is_never_cached(start, override):
    cfg, artifacts = start(override)
    assert prompt_cache.cache_key(cfg, artifacts) is None


def test_the_cache_keeps_its_newest_entries(start, monkeypatch):
    monkeypatch.setattr(prompt_cache, "KEEP", 2)
    for n in (10, 11, 12):
        cfg, artifacts = start(f"data.max_prompts={n}")
        inputs.encode_datasets(cfg, artifacts)
    entries = list((prompt_cache.entry_path(cfg, "x").parent).glob("*.json"))
    assert len(entries) == 2


def test_a_start_that_takes_an_entry_keeps_it_over_newer_unused_ones(start, monkeypatch):
    monkeypatch.setattr(prompt_cache, "KEEP", 2)
    used, used_artifacts = start("data.max_prompts=10")
    inputs.encode_datasets(used, used_artifacts)
    used_path = prompt_cache.entry_path(used, prompt_cache.cache_key(used, used_artifacts))
    os.utime(used_path, (1_000, 1_000))  # written long ago
    other, other_artifacts = start("data.max_prompts=11")
    inputs.encode_datasets(other, other_artifacts)
    other_path = prompt_cache.entry_path(other, prompt_cache.cache_key(other, other_artifacts))
    # written later than `used`, but explicitly in the past: file times are as coarse as the
    # kernel's tick, so "now" could tie with the touch below (CI saw exactly that tie)
    os.utime(other_path, (2_000, 2_000))
    inputs.encode_datasets(used, used_artifacts)  # taken again: marked used
    assert used_path.stat().st_mtime > 2_000
    newest, newest_artifacts = start("data.max_prompts=12")
    inputs.encode_datasets(newest, newest_artifacts)
    kept = {p.name for p in used_path.parent.glob("*.json")}
    newest_path = prompt_cache.entry_path(newest, prompt_cache.cache_key(newest, newest_artifacts))
    assert kept == {used_path.name, newest_path.name}  # the entry not used since is gone
