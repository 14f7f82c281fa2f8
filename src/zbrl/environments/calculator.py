"""Safe arithmetic: a parsed expression of numbers and ``+ - * / // % **`` evaluated node by
node (no ``eval``, no names, no calls, no attribute access), with bounded sizes."""

from __future__ import annotations

import ast
import math
import operator

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 64
MAX_DIGITS = 100
"""Integers longer than this (in decimal digits) are refused: no expression can run for long."""

_MAX_BITS = math.ceil(MAX_DIGITS * math.log2(10))

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """The expression cannot be evaluated; the message is shown to the model."""


def calculate(expression: str) -> str:
    """The value of ``expression`` as text: integers exactly, other numbers to 12 significant
    digits (``"123*456"`` → ``"56088"``, ``"7/2"`` → ``"3.5"``)."""
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {text!r}") from None
    return _format(_eval(tree.body))


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except (OverflowError, ValueError) as e:
            raise CalculatorError(str(e)) from None
    raise CalculatorError(
        f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}"
    )


def _checked(value: int | float | complex) -> int | float:
    if isinstance(value, complex):
        raise CalculatorError("complex result")
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        raise CalculatorError(f"number longer than {MAX_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    return value


def _format(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return format(value, ".12g")
    return str(value)
