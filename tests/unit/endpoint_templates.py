"""Chat templates for endpoint tests, on the embedded tokenizer: one that renders tools, tool
calls and tool messages (Hermes-style), and one that also drops past turns' ``<think>`` content
the way Qwen3's template does."""

import copy

from episode_stubs import TOKENIZER

_TOOLS = (
    "{{ bos_token }}{% if tools %}<|system|>tools: "
    "{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}"
    "{{ eos_token }}{% endif %}"
)
_MESSAGES = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|user|>result: {{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'assistant' %}<|assistant|>{CONTENT}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{% endfor %}{{ eos_token }}"
    "{% else %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_KEEP = "{{ m.content }}"
_DROP_PAST_THINKING = (
    # as Qwen3's: an assistant turn before the last user message loses its <think> block
    "{% set ns = namespace(last_user=-1) %}"
    "{% for x in messages %}{% if x.role == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor %}"
    "{% if loop.index0 < ns.last_user and '</think>' in m.content %}"
    "{{ m.content.split('</think>')[-1].lstrip('\\n') }}{% else %}{{ m.content }}{% endif %}"
)


def tokenizer(*, drop_past_thinking=False):
    """A copy of the embedded tokenizer with a tool-rendering template."""
    t = copy.deepcopy(TOKENIZER)
    content = _DROP_PAST_THINKING if drop_past_thinking else _KEEP
    t.chat_template = _TOOLS + _MESSAGES.replace("{CONTENT}", content)
    return t
