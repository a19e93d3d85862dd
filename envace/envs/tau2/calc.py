"""τ²'s `calculate` tool without `eval`.

The airline and retail toolkits answer `calculate(expression)` with `eval` on the model's text (characters
restricted to digits, `+-*/().` and spaces). That is model output reaching `eval`, and `9**9**9` alone
would hang a worker, so every environment built here swaps the tool for this walker of the parsed
expression. It returns what τ²'s tool returns (`str(round(float(value), 2))`) and raises the same
exceptions with the same messages, Python's own arithmetic producing both; the one difference is that an
integer power too large for a float is refused up front instead of being computed first.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

_ALLOWED_CHARS = "0123456789+-*/(). "
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# A power whose result needs more bits than this can never become a float, which is all τ²'s tool returns.
_MAX_POWER_BITS = 1 << 16


def _power(base: Any, exponent: Any) -> Any:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if exponent * (abs(base).bit_length() - 1) > _MAX_POWER_BITS:
            raise OverflowError("int too large to convert to float")
    return operator.pow(base, exponent)


def _value(root: ast.AST) -> Any:
    """Evaluate the tree bottom-up with an explicit stack: `1+1+…+1` nests a thousand deep, which a recursive
    walk cannot follow but `eval` can. Operands are applied left to right, as `eval` applies them."""
    stack: list[tuple[ast.AST, bool]] = [(root, False)]
    values: list[Any] = []
    while stack:
        node, children_done = stack.pop()
        if isinstance(node, ast.Constant):
            values.append(node.value)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            if not children_done:
                stack += [(node, True), (node.right, False), (node.left, False)]
                continue
            right, left = values.pop(), values.pop()
            values.append(_power(left, right) if isinstance(node.op, ast.Pow) else _BINARY[type(node.op)](left, right))
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            if not children_done:
                stack += [(node, True), (node.operand, False)]
                continue
            values.append(_UNARY[type(node.op)](values.pop()))
        else:
            raise ValueError("Invalid expression")
    return values.pop()


def calculate(expression: str) -> str:
    """τ²'s `calculate` semantics: allowed characters checked first, result rounded to 2 places."""
    if not all(char in _ALLOWED_CHARS for char in expression):
        raise ValueError("Invalid characters in expression")
    # `eval` strips leading spaces and tabs from a string; parsing with its filename keeps its messages.
    tree = ast.parse(expression.lstrip(" \t"), filename="<string>", mode="eval")
    return str(round(float(_value(tree.body)), 2))
