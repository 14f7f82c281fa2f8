"""Hugging Face ``datasets`` as a data source: local files, saved datasets, hub names (offline),
the column mapping, and every other column reaching the reward (through a real Producer)."""

from __future__ import annotations

import json
import socket

import datasets
import pytest
import torch
from role_settings import buffer_settings, producer_settings, sampling_params, single_turn

from zbrl.assembly.datasets import encode_prompts, load_set_examples, open_dataset_refs
from zbrl.assembly.rewards import build_reward_fn
from zbrl.config import ConfigError, load_config
from zbrl.data import hf_source
from zbrl.data.dataset import DatasetError, load_examples
from zbrl.errors import RunError
from zbrl.rollout.backends.base import Completion
from zbrl.rollout.producer import Producer
from zbrl.telemetry.spans import SpanRecorder
from zbrl.transport.buffer import RolloutBuffer
from zbrl.transport.clients import BufferClient, WeightStoreClient
from zbrl.transport.handles import LocalHandle
from zbrl.transport.weight_sync.object_store import ObjectStoreReceiver
from zbrl.transport.weight_sync.store import WeightStore

ROWS = {
    "question": ["What is 2+3?", "What is 7-4?", "What is 6+1?"],
    "answer": ["5", "3", "7"],
    "difficulty": [0.25, 0.5, 0.75],
    "tags": [["add"], ["sub"], ["add"]],
}
MAPPING = "{prompt: question, answer: answer}"


def refs_of(cfg):
    """What the training set and each eval set read (no embedded task in these configs)."""
    return open_dataset_refs(cfg).with_task_files(None, None)


def hf_config(path, *extra):
    return load_config(
        None,
        [
            f"data.source={{type: hf, path: {path}, columns: {MAPPING}}}",
            "eval.sets={}",
            *extra,
        ],
    )


def saved_dict(tmp_path):
    """A DatasetDict (train: ROWS, test: the first row) written with save_to_disk."""
    train = datasets.Dataset.from_dict(ROWS)
    test = datasets.Dataset.from_dict({k: v[:1] for k, v in ROWS.items()})
    path = tmp_path / "saved"
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(path))
    return path


def test_jsonl_file_maps_columns_and_keeps_the_others_in_fields(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [dict(zip(ROWS, values)) for values in zip(*ROWS.values())]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = hf_config(path)
    train, evals = refs_of(cfg)
    examples = load_set_examples(train, cfg).examples
    assert evals == {}
    assert [e.messages for e in examples] == [
        ({"role": "user", "content": q},) for q in ROWS["question"]
    ]
    assert [e.gt_answer for e in examples] == ["5", "3", "7"]
    assert [e.fields for e in examples] == [
        {"difficulty": d, "tags": t} for d, t in zip(ROWS["difficulty"], ROWS["tags"])
    ]
    assert [e.uid for e in examples] == ["qa:train:1", "qa:train:2", "qa:train:3"]
    assert examples[1].to_example()["fields"] == {"difficulty": 0.5, "tags": ["sub"]}


def test_csv_file_and_a_conversation_column(tmp_path):
    path = tmp_path / "qa.csv"
    path.write_text("prompt,answer,source\nWhat is 1+1?,2,book\n")
    cfg = load_config(None, [f"data.source={{type: hf, path: {path}}}", "eval.sets={}"])
    (example,) = load_set_examples(refs_of(cfg)[0], cfg).examples
    assert example.messages == ({"role": "user", "content": "What is 1+1?"},)
    assert (example.gt_answer, example.fields) == ("2", {"source": "book"})

    conv = tmp_path / "conv.jsonl"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2?"}]
    conv.write_text(json.dumps({"messages": messages, "gt_answer": 3, "level": 1}) + "\n")
    cfg = load_config(
        None,
        [
            f"data.source={{type: hf, path: {conv}, columns: {{prompt: messages, "
            "answer: gt_answer}}",
            "eval.sets={}",
        ],
    )
    (example,) = load_set_examples(refs_of(cfg)[0], cfg).examples
    assert example.messages == tuple(messages)
    assert (example.gt_answer, example.fields) == ("3", {"level": 1})


def test_saved_dataset_dict_gives_train_and_held_out_splits(tmp_path):
    path = saved_dict(tmp_path)
    cfg = hf_config(path, "data.source.eval_split=test", "eval.sets={heldout: held_out}")
    train, evals = refs_of(cfg)
    assert len(load_set_examples(train, cfg).examples) == 3
    (held,) = load_set_examples(evals["heldout"], cfg).examples
    assert held.uid == "saved:test:1" and held.gt_answer == "5"


def test_missing_column_and_unknown_split_name_the_fix(tmp_path):
    path = saved_dict(tmp_path)
    cfg = load_config(None, [f"data.source={{type: hf, path: {path}}}", "eval.sets={}"])
    with pytest.raises(DatasetError, match=r"no column 'prompt'.*columns: question, answer"):
        load_set_examples(refs_of(cfg)[0], cfg)
    cfg = hf_config(path, "data.source.split=validation")
    with pytest.raises(DatasetError, match=r"split 'validation' is not in .*splits: train, test"):
        load_set_examples(refs_of(cfg)[0], cfg)


def test_bad_row_names_the_row_and_can_be_skipped(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(
        json.dumps({"question": "ok?", "answer": "1"})
        + "\n"
        + json.dumps({"question": "", "answer": "2"})
        + "\n"
    )
    cfg = hf_config(path)
    with pytest.raises(DatasetError, match=r"qa.jsonl\[train\] row 2: the prompt 'question'"):
        load_set_examples(refs_of(cfg)[0], cfg)
    cfg = hf_config(path, "data.skip_bad_lines=true")
    report = load_set_examples(refs_of(cfg)[0], cfg)
    assert len(report.examples) == 1 and report.num_skipped == 1


def test_hub_name_offline_is_a_run_error_naming_the_dataset_and_the_fetch(monkeypatch):
    def unreachable(*args, **kwargs):
        raise OSError("Name or service not known")

    def never(*args, **kwargs):
        raise AssertionError("load_dataset must not be called when the hub is unreachable")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(datasets, "load_dataset", never)
    with pytest.raises(RunError) as info:
        hf_source.open_hf_split("openai/gsm8k", split="train", name="main")
    message = str(info.value)
    assert "'openai/gsm8k'" in message and "unreachable" in message
    assert "load_dataset('openai/gsm8k', 'main').save_to_disk" in message
    assert "HF_HUB_OFFLINE=1" in message


def test_offline_mode_skips_the_probe_and_wraps_the_cache_miss(monkeypatch):
    def probe(*args, **kwargs):
        raise AssertionError("no probe in offline mode")

    def cache_miss(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'org/data' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", probe)
    monkeypatch.setattr(datasets, "load_dataset", cache_miss)
    with pytest.raises(RunError, match=r"data.source.path='org/data'.*save_to_disk"):
        hf_source.open_hf_split("org/data", split="train")


def test_missing_local_path_is_a_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        hf_source.open_hf_split(str(tmp_path / "nope.jsonl"), split="train")
    single = tmp_path / "one.jsonl"
    single.write_text('{"prompt": "a", "answer": "1"}\n')
    with pytest.raises(DatasetError, match="single data file, which has one split"):
        hf_source.open_hf_split(str(single), split="test")


def test_config_refuses_conflicting_or_missing_sources(tmp_path):
    with pytest.raises(ConfigError, match=r"train_path .* and data.source .* are both set"):
        load_config(None, ["data.train_path=x.jsonl", "data.source={type: hf, path: d}"])
    with pytest.raises(ConfigError, match="evaluates the embedded arithmetic task"):
        load_config(None, ["data.source={type: hf, path: d}"])
    with pytest.raises(ConfigError, match="no eval_split"):
        load_config(None, ["data.source={type: hf, path: d}", "eval.sets={t: held_out}"])
    with pytest.raises(ConfigError, match="has no held-out split"):
        load_config(None, ["data.train_path=x.jsonl", "eval.sets={t: held_out}"])


def test_conversation_file_keeps_extra_keys_in_fields(tmp_path):
    path = tmp_path / "train.jsonl"
    line = {"messages": [{"role": "user", "content": "1+1?"}], "gt_answer": "2", "level": 3}
    path.write_text(json.dumps(line) + "\n")
    (example,) = load_examples(path, answer_field="gt_answer").examples
    assert example.fields == {"level": 3}
    assert example.to_example()["fields"] == {"level": 3}


# ---------------------------------------------------------------------------------------------
# An extra column of a `datasets` dataset reaches a user reward, through a real Producer.

USER_REWARD = '''
def by_difficulty(response, example, ctx, scale=1.0):
    """Reward = the row's difficulty column (a column zbrl does not know about)."""
    fields = example["fields"]
    correct = response.strip() == example["gt_answer"]
    return (scale * fields["difficulty"], 1.0, float(correct))
'''


class CharTokenizer:
    """Prompt ids = the characters of the last user message (enough to find the row again)."""

    chat_template = "stub"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return [ord(c) for c in messages[-1]["content"]]


class AnswerBackend:
    """Answers every prompt with its row's answer (found from the prompt's characters)."""

    def __init__(self, answers):
        self.answers = answers

    def generate(self, prompts, params):
        out = []
        for ids in prompts:
            text = self.answers["".join(map(chr, ids))]
            comps = [
                Completion(torch.tensor([1, 2]), torch.zeros(2), text, "stop")
                for _ in range(params.n)
            ]
            out.append(comps)
        return out

    def load_weights(self, named_tensors):
        pass

    def release_memory(self):
        pass


def test_a_datasets_column_reaches_a_user_reward_through_the_producer(tmp_path, monkeypatch):
    module = tmp_path / "user_rewards_hf.py"
    module.write_text(USER_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = saved_dict(tmp_path)
    cfg = hf_config(
        path,
        "reward={type: 'user_rewards_hf:by_difficulty', options: {scale: 2.0}, timeout_s: null}",
    )
    prompts, _ = encode_prompts(refs_of(cfg)[0], cfg, CharTokenizer())
    reward = build_reward_fn(cfg)

    buffer = RolloutBuffer(buffer_settings(groups_per_step=1, max_staleness=100, num_producers=1))
    receiver = ObjectStoreReceiver(
        WeightStoreClient(LocalHandle(WeightStore())), poll_interval_s=0.01, initial_version=0
    )
    answers = dict(zip(ROWS["question"], ROWS["answer"]))
    sampling = sampling_params(n=2, temperature=1.0, max_new_tokens=4)
    producer = Producer(
        producer_settings(
            index=0,
            num_producers=1,
            sampling=sampling,
            inference_batch_size=1,
            inference_microbatch_size=1,
            num_epochs=1,
            seed=0,
            shuffle=False,
        ),
        prompts,
        AnswerBackend(answers),
        reward,
        BufferClient(LocalHandle(buffer)),
        receiver,
        SpanRecorder("producer-0", "producer"),
        single_turn(sampling),
    )
    try:
        assert producer.run().groups == 3
    finally:
        receiver.close()
    status, batch = buffer.take(3, timeout=0)
    assert status == "batch"
    by_uid = {g.uid: g for g in batch.groups}
    for i, difficulty in enumerate(ROWS["difficulty"]):
        group = by_uid[f"saved:train:{i + 1}@e0"]
        assert group.rewards == [2.0 * difficulty] * 2  # the column, scaled by the option
        assert group.ans_acc == [1.0, 1.0]
