"""Dataset loading/validation (zbrl.data.dataset) and prompt encoding (zbrl.data.prompts)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from zbrl.data import (
    DatasetError,
    PromptEncoder,
    PromptExample,
    as_token_ids,
    build_messages,
    load_examples,
    resolve_system_prompt,
)

USER = {"role": "user", "content": "What is 2 + 3 ?"}
GOOD_MATH = {"messages": [USER], "gt_answer": "5"}
GOOD_CODE = {"messages": [USER], "test_cases": {"inputs": ["1\n"], "outputs": ["2\n"]}}


def write_lines(tmp_path: Path, lines: list, name: str = "data.jsonl") -> Path:
    """Write each item as one line: dicts/lists as JSON, strings verbatim."""
    path = tmp_path / name
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def assert_bad_line(tmp_path, bad, *, answer_field="gt_answer", expect: str) -> DatasetError:
    """A bad object on line 3 raises a DatasetError naming the file, line 3 and the problem."""
    good = GOOD_MATH if answer_field == "gt_answer" else GOOD_CODE
    path = write_lines(tmp_path, [good, good, bad, good])
    with pytest.raises(DatasetError) as info:
        load_examples(path, answer_field=answer_field)
    message = str(info.value)
    assert "data.jsonl" in message
    assert "line 3" in message
    assert expect in message
    assert "Fix:" in message
    assert info.value.line == 3
    return info.value


# --- good input -------------------------------------------------------------------------------


def test_loads_math_examples_with_stable_uids(tmp_path):
    path = write_lines(tmp_path, [GOOD_MATH, "", "   ", {"messages": [USER], "gt_answer": "7"}])
    report = load_examples(path, answer_field="gt_answer")
    assert [e.uid for e in report.examples] == ["data:1", "data:4"]
    assert [e.source for e in report.examples] == [f"{path}:1", f"{path}:4"]
    assert [e.gt_answer for e in report.examples] == ["5", "7"]
    assert report.skipped == []
    again = load_examples(path, answer_field="gt_answer")
    assert [e.uid for e in again.examples] == [e.uid for e in report.examples]


def test_to_example_is_the_reward_mapping_and_a_copy(tmp_path):
    path = write_lines(tmp_path, [GOOD_MATH])
    example = load_examples(path, answer_field="gt_answer").examples[0]
    mapping = example.to_example()
    assert mapping == {"messages": [USER], "gt_answer": "5", "test_cases": None, "fields": {}}
    mapping["messages"][0]["content"] = "changed"
    assert example.messages[0]["content"] == USER["content"]


def test_single_message_object_is_wrapped(tmp_path):
    path = write_lines(tmp_path, [{"messages": USER, "gt_answer": "5"}])
    example = load_examples(path, answer_field="gt_answer").examples[0]
    assert example.messages == (USER,)


def test_message_extra_keys_are_dropped(tmp_path):
    path = write_lines(tmp_path, [{"messages": [{**USER, "name": "x"}], "gt_answer": "5"}])
    example = load_examples(path, answer_field="gt_answer").examples[0]
    assert example.messages == (USER,)


@pytest.mark.parametrize(("value", "expected"), [(5, "5"), (-3, "-3"), (0.5, "0.5")])
def test_numbers_as_gt_answer_become_strings(tmp_path, value, expected):
    path = write_lines(tmp_path, [{"messages": [USER], "gt_answer": value}])
    assert load_examples(path, answer_field="gt_answer").examples[0].gt_answer == expected


def test_test_cases_as_object(tmp_path):
    cases = {"inputs": ["1\n", "2\n"], "outputs": ["2\n", "4\n"], "fn_name": "double"}
    path = write_lines(tmp_path, [{"messages": [USER], "test_cases": cases}])
    example = load_examples(path, answer_field="test_cases").examples[0]
    assert example.test_cases == cases
    assert example.gt_answer is None
    assert example.to_example()["test_cases"] == cases


def test_test_cases_as_json_string(tmp_path):
    cases = {"inputs": ["1\n"], "outputs": ["2\n"]}
    path = write_lines(tmp_path, [{"messages": [USER], "test_cases": json.dumps(cases)}])
    example = load_examples(path, answer_field="test_cases").examples[0]
    assert example.test_cases == cases


def test_other_answer_field_is_ignored(tmp_path):
    row = {"messages": [USER], "gt_answer": "5", "test_cases": "not json"}
    path = write_lines(tmp_path, [row])
    example = load_examples(path, answer_field="gt_answer").examples[0]
    assert example.test_cases is None


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"messages": [USER], "gt_answer": "5"},
        {"messages": [{"role": "system", "content": "Be brief."}, USER], "gt_answer": "5"},
    ]
    path = tmp_path / "math.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    report = load_examples(path, answer_field="gt_answer")
    assert [e.uid for e in report.examples] == ["math:1", "math:2"]
    assert [list(e.messages) for e in report.examples] == [r["messages"] for r in rows]
    assert [e.gt_answer for e in report.examples] == ["5", "5"]


def test_parquet_test_cases_struct_and_string(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    cases = {"inputs": ["1\n"], "outputs": ["2\n"], "fn_name": None}
    path = tmp_path / "code.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": [USER], "test_cases": cases}]), path)
    example = load_examples(path, answer_field="test_cases").examples[0]
    assert example.test_cases == {"inputs": ["1\n"], "outputs": ["2\n"]}
    path2 = tmp_path / "code2.parquet"
    as_text = json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})
    pq.write_table(pa.Table.from_pylist([{"messages": [USER], "test_cases": as_text}]), path2)
    assert load_examples(path2, answer_field="test_cases").examples[0].test_cases == {
        "inputs": ["1\n"],
        "outputs": ["2\n"],
    }


def test_parquet_bad_row_names_file_and_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [GOOD_MATH, {"messages": [USER], "gt_answer": None}]
    path = tmp_path / "math.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DatasetError, match=r"math\.parquet row 2: 'gt_answer' is missing"):
        load_examples(path, answer_field="gt_answer")


# --- bad lines: one test per problem ---------------------------------------------------------


def test_invalid_json(tmp_path):
    assert_bad_line(tmp_path, '{"messages": [', expect="invalid JSON")


def test_line_not_an_object(tmp_path):
    assert_bad_line(tmp_path, [USER], expect="expected a JSON object, got a list")


def test_missing_messages(tmp_path):
    assert_bad_line(tmp_path, {"gt_answer": "5"}, expect="'messages' is missing")


def test_messages_wrong_type(tmp_path):
    bad = {"messages": "What is 2+3?", "gt_answer": "5"}
    assert_bad_line(tmp_path, bad, expect="'messages' must be a list")


def test_messages_empty(tmp_path):
    assert_bad_line(tmp_path, {"messages": [], "gt_answer": "5"}, expect="'messages' is empty")


def test_message_without_content(tmp_path):
    bad = {"messages": [{"role": "user"}], "gt_answer": "5"}
    assert_bad_line(tmp_path, bad, expect="message 1 (user) has no 'content'")


@pytest.mark.parametrize("content", ["", "   \n\t"])
def test_message_with_empty_content(tmp_path, content):
    bad = {"messages": [{"role": "user", "content": content}], "gt_answer": "5"}
    assert_bad_line(tmp_path, bad, expect="is empty or whitespace")


def test_message_content_not_a_string(tmp_path):
    bad = {"messages": [{"role": "user", "content": [{"type": "text"}]}], "gt_answer": "5"}
    assert_bad_line(tmp_path, bad, expect="must be a string, got a list")


def test_unknown_role_lists_allowed_roles(tmp_path):
    bad = {"messages": [USER, {"role": "tool", "content": "x"}], "gt_answer": "5"}
    error = assert_bad_line(tmp_path, bad, expect="message 2 has unknown role 'tool'")
    assert "system, user, assistant" in str(error)


def test_message_without_role(tmp_path):
    bad = {"messages": [{"content": "hi"}], "gt_answer": "5"}
    assert_bad_line(tmp_path, bad, expect="message 1 has no 'role'")


def test_no_user_message(tmp_path):
    bad = {"messages": [{"role": "system", "content": "hi"}], "gt_answer": "5"}
    assert_bad_line(tmp_path, bad, expect="no user message")


def test_missing_gt_answer_says_which_reward_needs_it(tmp_path):
    error = assert_bad_line(tmp_path, {"messages": [USER]}, expect="'gt_answer' is missing")
    assert "math rewards" in str(error)


def test_missing_test_cases_says_which_reward_needs_it(tmp_path):
    error = assert_bad_line(
        tmp_path, {"messages": [USER]}, answer_field="test_cases", expect="'test_cases' is missing"
    )
    assert "code reward" in str(error)


@pytest.mark.parametrize(
    ("bad_value", "expect"),
    [
        ({"flag": True}, "must be a string or a number, got an object"),
        (True, "got a boolean"),
        ("  ", "'gt_answer' is empty"),
    ],
)
def test_bad_gt_answer(tmp_path, bad_value, expect):
    assert_bad_line(tmp_path, {"messages": [USER], "gt_answer": bad_value}, expect=expect)


@pytest.mark.parametrize(
    ("cases", "expect"),
    [
        ({"outputs": ["1"]}, "no 'inputs' list"),
        ({"inputs": ["1"]}, "no 'outputs' list"),
        ({"inputs": "1", "outputs": ["1"]}, "'test_cases.inputs' must be a list"),
        ({"inputs": ["1", 2], "outputs": ["1", "2"]}, "'test_cases.inputs[1]' must be a string"),
        ({"inputs": ["1", "2"], "outputs": ["1"]}, "has 2 items but 'test_cases.outputs' has 1"),
        ({"inputs": [], "outputs": []}, "'test_cases.inputs' is empty"),
        ({"inputs": ["1"], "outputs": ["1"], "fn_name": 3}, "'test_cases.fn_name'"),
        ({"inputs": ["1"], "outputs": ["1"], "output": ["1"]}, "unknown key(s) 'output'"),
        ("{not json", "'test_cases' is a string but not valid JSON"),
        ([["1"], ["1"]], "'test_cases' must be an object"),
    ],
)
def test_malformed_test_cases_name_the_key(tmp_path, cases, expect):
    bad = {"messages": [USER], "test_cases": cases}
    assert_bad_line(tmp_path, bad, answer_field="test_cases", expect=expect)


def test_invalid_utf8(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(json.dumps(GOOD_MATH).encode() + b"\n" + b'{"x": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"data\.jsonl line 2: the line is not valid UTF-8"):
        load_examples(path, answer_field="gt_answer")


# --- file-level errors ------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.jsonl does not exist"):
        load_examples(tmp_path / "nope.jsonl", answer_field="gt_answer")


def test_unsupported_extension(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("messages,gt_answer\n")
    with pytest.raises(DatasetError, match=r"unsupported .*'\.csv'.*data\.csv.*JSONL"):
        load_examples(path, answer_field="gt_answer")


def test_directory_is_rejected(tmp_path):
    with pytest.raises(DatasetError, match="is not a file"):
        load_examples(tmp_path, answer_field="gt_answer")


def test_empty_file(tmp_path):
    path = write_lines(tmp_path, ["", "  "])
    with pytest.raises(DatasetError, match=r"no usable examples in .*data\.jsonl \(0 lines"):
        load_examples(path, answer_field="gt_answer")


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "data.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=r"cannot read .*data\.parquet as Parquet"):
        load_examples(path, answer_field="gt_answer")


def test_bad_answer_field_argument(tmp_path):
    path = write_lines(tmp_path, [GOOD_MATH])
    with pytest.raises(ValueError, match="answer_field must be one of"):
        load_examples(path, answer_field="answer")  # type: ignore[arg-type]


# --- skip_bad_lines ---------------------------------------------------------------------------


def test_skip_bad_lines_reports_count_and_reasons(tmp_path, caplog):
    lines = [GOOD_MATH, "{broken", {"messages": []}, GOOD_MATH, {"messages": [USER]}]
    path = write_lines(tmp_path, lines)
    with caplog.at_level(logging.WARNING, logger="zbrl.data.dataset"):
        report = load_examples(path, answer_field="gt_answer", skip_bad_lines=True)
    assert [e.uid for e in report.examples] == ["data:1", "data:4"]
    assert report.num_skipped == 3
    assert [source for source, _ in report.skipped] == [f"{path}:2", f"{path}:3", f"{path}:5"]
    assert "invalid JSON" in report.skipped[0][1]
    assert "skipped 3 bad lines" in report.summary()
    assert "skipped 3 bad lines" in caplog.text


def test_skip_bad_lines_still_raises_when_nothing_is_usable(tmp_path):
    path = write_lines(tmp_path, ["{broken", {"messages": [USER]}])
    with pytest.raises(DatasetError, match=r"no usable examples in .*data\.jsonl \(2 lines skip"):
        load_examples(path, answer_field="gt_answer", skip_bad_lines=True)


# --- prompts ----------------------------------------------------------------------------------

WORDS = ["what", "is", "2", "+", "3", "?", "be", "brief", ".", "a", "b", "c", "d"]
SPECIAL = ["<unk>", "<pad>", "<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    """A tiny local WordLevel tokenizer with a chat template (no hub access)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>")
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        additional_special_tokens=SPECIAL[3:],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def example_with(content: str, system: str | None = None) -> PromptExample:
    messages = [{"role": "user", "content": content}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return PromptExample("t:1", tuple(messages), "5", None, "t.jsonl:1")


def test_each_reward_owns_a_system_prompt_describing_its_format():
    from zbrl.rewards.boxed import BoxedReward
    from zbrl.rewards.code import CodeReward
    from zbrl.rewards.think_answer import ThinkAnswerReward

    tags = ThinkAnswerReward.system_prompt
    assert all(t in tags for t in ("<think>", "</think>", "<answer>", "</answer>"))
    assert "\\boxed{" in BoxedReward.system_prompt
    assert "```python" in CodeReward.system_prompt


def test_resolve_system_prompt():
    assert resolve_system_prompt(None, "the reward's own") == "the reward's own"
    assert resolve_system_prompt("be brief .", "the reward's own") == "be brief ."
    assert resolve_system_prompt("", "the reward's own") is None
    assert resolve_system_prompt(None, None) is None  # a user reward has none


def test_build_messages_prepends_system_prompt():
    messages = build_messages(example_with("what is 2 + 3 ?"), "be brief .")
    assert messages == [
        {"role": "system", "content": "be brief ."},
        {"role": "user", "content": "what is 2 + 3 ?"},
    ]


def test_build_messages_keeps_the_examples_own_system_message():
    example = example_with("what is 2 + 3 ?", system="a b")
    assert build_messages(example, "be brief .") == list(example.messages)
    assert build_messages(example.to_example(), "be brief .") == list(example.messages)


@pytest.mark.parametrize("system_prompt", [None, "", "  "])
def test_build_messages_without_system_prompt(system_prompt):
    assert build_messages(example_with("a"), system_prompt) == [{"role": "user", "content": "a"}]


def test_encode_applies_template_with_generation_prompt(tokenizer):
    encoder = PromptEncoder(tokenizer, max_prompt_tokens=64, system_prompt="be brief .")
    ids = encoder.encode(example_with("what is 2 + 3 ?"))
    expected = ids_of(tokenizer, "<s><|system|> be brief . <|end|> ")
    expected += ids_of(tokenizer, "<|user|> what is 2 + 3 ? <|end|> <|assistant|>")
    assert ids == expected
    assert isinstance(ids, list)
    assert all(type(i) is int for i in ids)


def test_encode_keeps_examples_system_message(tokenizer):
    encoder = PromptEncoder(tokenizer, max_prompt_tokens=64, system_prompt="be brief .")
    ids = encoder.encode(example_with("what", system="a b"))
    assert ids == ids_of(tokenizer, "<s><|system|> a b <|end|> <|user|> what <|end|> <|assistant|>")


def test_overlong_drop(tokenizer):
    short, long = example_with("a"), example_with("a b c d a b c d a b c d")
    encoder = PromptEncoder(tokenizer, max_prompt_tokens=8, overlong="drop", system_prompt=None)
    assert encoder.encode(long) is None
    assert encoder.dropped == 1
    kept, stats = encoder.encode_all([short, long, short])
    assert [e for e, _ in kept] == [short, short]
    assert stats["examples"] == 3
    assert stats["kept"] == 2
    assert stats["dropped"] == 1
    assert stats["truncated"] == 0
    assert stats["longest_prompt_tokens"] == 16
    assert encoder.dropped == 2


def test_overlong_left_truncate_keeps_the_generation_prompt(tokenizer):
    long = example_with("a b c d a b c d a b c d")
    full = PromptEncoder(tokenizer, max_prompt_tokens=100, system_prompt=None).encode(long)
    assert len(full) == 16
    encoder = PromptEncoder(
        tokenizer, max_prompt_tokens=6, overlong="left_truncate", system_prompt=None
    )
    ids = encoder.encode(long)
    assert ids == full[-6:]
    assert ids[-2:] == ids_of(tokenizer, "<|end|> <|assistant|>")
    assert encoder.truncated == 1
    _, stats = encoder.encode_all([long, example_with("a")])
    assert stats["truncated"] == 1
    assert stats["kept"] == 2
    assert stats["dropped"] == 0


def test_encode_all_raises_when_every_prompt_is_dropped(tokenizer):
    encoder = PromptEncoder(tokenizer, max_prompt_tokens=3, system_prompt=None)
    with pytest.raises(DatasetError, match="all 2 prompts are longer than max_prompt_tokens=3"):
        encoder.encode_all([example_with("a"), example_with("b")])


def test_encoder_rejects_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="max_prompt_tokens must be >= 1"):
        PromptEncoder(tokenizer, max_prompt_tokens=0, system_prompt=None)
    with pytest.raises(ValueError, match="overlong must be one of"):
        PromptEncoder(tokenizer, max_prompt_tokens=8, overlong="right", system_prompt=None)


def test_as_token_ids_normalises_return_types():
    class FakeTensor:
        def tolist(self):
            return [[1, 2, 3]]

    assert as_token_ids([1, 2, 3]) == [1, 2, 3]
    assert as_token_ids({"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]}) == [1, 2, 3]
    assert as_token_ids({"input_ids": [[1, 2, 3]]}) == [1, 2, 3]
    assert as_token_ids(FakeTensor()) == [1, 2, 3]
    with pytest.raises(TypeError, match="tokenize=True"):
        as_token_ids("<s> text")
