"""What the model is told about its tools (zbrl.environments.tool_prompt): a template that renders
tools gets them as ``tools=`` (a Qwen2.5-style template written here), one that does not (the
embedded model's) gets a system-prompt section in the call format; either way each tool's
description is in the prompt, and environment messages are the text the template writes in the
same conversation (prefix preservation with the tools). SmolLM2's real template:
tests/realmodel/test_smollm2_episodes.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from zbrl.assembly.datasets import encode_prompts
from zbrl.config import ConfigError, load_config
from zbrl.data.prompts import PromptEncoder
from zbrl.environments.build import build_tool
from zbrl.environments.tool_prompt import tool_prompt, tool_schema, tools_section
from zbrl.environments.tools import Calculator, SandboxedPython
from zbrl.errors import RunError
from zbrl.rollout.turns import TurnFormatter

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "recipes" / "demo.yaml")

QWEN_STYLE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}You are a helpful assistant.{% endif %}\n\n# Tools\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    'Call a function as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n'
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n"
    "{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{%- elif m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A small template that renders ``tools`` as Qwen2.5's does (a system message listing each
tool's JSON schema) and ``tool`` messages as user turns in ``<tool_response>``."""

TOOLS = [Calculator(), SandboxedPython()]


@pytest.fixture
def embedded_tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def qwen_style(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = QWEN_STYLE
    return tokenizer


def render(tokenizer, messages, tools, *, generation_prompt=True) -> str:
    extra = {} if tools is None else {"tools": tools}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, **extra
    )


def test_the_built_in_tools_have_a_schema_of_their_argument():
    assert tool_schema(Calculator()) == {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": Calculator.DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "the expression, e.g. 347*628"}
                },
                "required": ["expression"],
            },
        },
    }
    python = tool_schema(SandboxedPython(description="Runs code."))["function"]
    assert python["name"] == "python" and python["description"] == "Runs code."
    assert python["parameters"]["required"] == ["code"]


def test_a_template_that_renders_tools_gets_them_as_the_tools_argument(qwen_style):
    told = tool_prompt(qwen_style, TOOLS, "hermes")
    assert told.system_section is None
    assert told.tools == [tool_schema(t) for t in TOOLS]
    text = render(qwen_style, [{"role": "user", "content": "Q"}], told.tools)
    for t in TOOLS:
        assert t.description in text
    # the tags format is not what such a template teaches: the tools go in the system prompt
    tags = tool_prompt(qwen_style, TOOLS, "tags")
    assert tags.tools is None and tags.system_section == tools_section(TOOLS, "tags")


def test_a_template_without_tools_gets_a_system_section(embedded_tokenizer):
    told = tool_prompt(embedded_tokenizer, TOOLS, "hermes")
    assert told.tools is None
    section = told.system_section
    assert section.startswith("You can call these tools:\n- calculator: ")
    for t in TOOLS:
        assert f"- {t.name}: {t.description} Arguments: {json.dumps(t.parameters)}" in section
    assert '<tool_call>{"name": "TOOL_NAME", "arguments": {"ARGUMENT": "VALUE"}}</tool_call>' in (
        section
    )
    tags = tools_section(TOOLS, "tags")
    assert "Call it with <calc>expression</calc>." in tags
    assert "Call it with <python>code</python>." in tags


@pytest.mark.parametrize("example_system", [False, True])
def test_the_encoder_renders_the_tools_as_the_template_takes_them(
    qwen_style, embedded_tokenizer, example_system
):
    messages = [{"role": "user", "content": "What is 2+3?"}]
    if example_system:
        messages.insert(0, {"role": "system", "content": "Be brief."})
    schemas = [tool_schema(t) for t in TOOLS]
    encoder = PromptEncoder(qwen_style, max_prompt_tokens=4096, system_prompt=None, tools=schemas)
    want = qwen_style.apply_chat_template(
        messages, tools=schemas, add_generation_prompt=True, tokenize=False
    )
    assert qwen_style.decode(encoder.encode({"messages": messages})) == want
    section = tools_section(TOOLS, "tags")
    plain = PromptEncoder(
        embedded_tokenizer, max_prompt_tokens=4096, system_prompt="Sys.", tool_section=section
    )
    system = "Be brief." if example_system else "Sys."
    want = embedded_tokenizer.apply_chat_template(
        [{"role": "system", "content": f"{system}\n\n{section}"}, messages[-1]],
        add_generation_prompt=True,
        tokenize=True,
    )
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert plain.encode({"messages": messages}) == list(want)


def test_environment_messages_stay_a_prefix_extension_with_the_tools(qwen_style):
    schemas = [tool_schema(t) for t in TOOLS]
    formatter = TurnFormatter(qwen_style, "tool", eos_ids={qwen_style.eos_token_id}, tools=schemas)
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    model_turn = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    full = render(
        qwen_style,
        [*prompt, {"role": "assistant", "content": model_turn}, {"role": "tool", "content": "5"}],
        schemas,
    )
    pieces = render(qwen_style, prompt, schemas) + model_turn + formatter.turn_close
    assert full == pieces + formatter.message_text("5")
    assert "<tool_response>\n5\n</tool_response>" in formatter.message_text("5")


def test_a_run_on_the_embedded_tokenizer_tells_the_model_its_tools(tiny_model_dir, task_files):
    """The run's own prompt path (encode_prompts) with the tools environment: the embedded
    template renders no tools, so the system prompt ends with the tools section; describe_tools
    false leaves the prompt as it was."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = [
        f"model.path={tiny_model_dir}",
        f"data.train_path={task_files[0]}",
        "eval.sets={}",
    ]
    env = "environment={type: tools, message_role: user, call_format: tags, tools: [calculator]}"
    told = load_config(DEMO, [*base, env])
    silent = load_config(DEMO, [*base, env, "environment.describe_tools=false"])
    (with_tools, *_), _ = encode_prompts(str(task_files[0]), told, tokenizer, limit=1)
    (without, *_), _ = encode_prompts(str(task_files[0]), silent, tokenizer, limit=1)
    text = tokenizer.decode(with_tools.prompt_ids)
    assert Calculator.DESCRIPTION in text and "<calc>expression</calc>" in text
    assert Calculator.DESCRIPTION not in tokenizer.decode(without.prompt_ids)
    assert len(with_tools.prompt_ids) > len(without.prompt_ids)


class Described:
    """A user tool as documented: name, description, parameters, tag, argument, call."""

    description = "Reverses a string."
    argument = "text"

    def __init__(self, name: str = "reverse") -> None:
        self.name, self.tag = name, "rev"
        self.parameters = {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        }

    def call(self, arguments):
        return arguments["text"][::-1]


class Undescribed:
    name, tag, argument = "reverse", "rev", "text"

    def call(self, arguments):
        return arguments["text"][::-1]


def test_a_user_tool_declares_its_description_and_schema():
    from zbrl.config.environments import UserTool

    here = f"{__name__}:Described"
    tool = build_tool(UserTool(type=here), 5.0)
    assert tool_schema(tool)["function"]["description"] == "Reverses a string."
    tool = build_tool(UserTool(type=here, description="Mirror text."), 5.0)
    assert tool_schema(tool)["function"]["description"] == "Mirror text."
    with pytest.raises(RunError, match="lacks description, parameters"):
        build_tool(UserTool(type=f"{__name__}:Undescribed"), 5.0)


def test_a_tool_description_cannot_be_empty():
    with pytest.raises(ConfigError, match="description"):
        load_config(
            DEMO, ["environment={type: tools, tools: [{type: calculator, description: ''}]}"]
        )
