"""A scripted model for agent-harness tests: it calls a calculator tool (Hermes
``<tool_call>`` blocks) on the task's product, then answers with the tool's value, as text or
through the harness's ``final_answer`` tool when the request declares one. The template renders
tools, tool calls and tool messages (endpoint_templates.py)."""

import json
import re

from endpoint_templates import tokenizer

TOKENIZER = tokenizer()
PRODUCT = re.compile(r"(\d+)\s*\*\s*(\d+)")
VALUE = re.compile(r"value (\d+)")


def product_value(x: str) -> str:
    """The calculator the harnesses are given: the value of a product ``a*b``."""
    a, b = PRODUCT.search(x).groups()
    return f"value {int(a) * int(b)}"


def _call(name, arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def hermes_calculator(context, sample):
    """The model's next turn given its context (see the module docstring)."""
    values = VALUE.findall(context)
    if not values:
        a, b = PRODUCT.search(context.split("<|user|>", 1)[-1]).groups()
        return _call("calc", {"x": f"{a}*{b}"})
    if "final_answer" in context.split("<|end|>", 1)[0]:  # the tools line of the template
        return _call("final_answer", {"answer": values[-1]})
    return f"The product is {values[-1]}."
