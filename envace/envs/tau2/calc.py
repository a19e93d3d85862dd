"""τ²'s `calculate` tool without `eval`.

The airline and retail toolkits answer `calculate(expression)` with `eval` on the model's text (characters
restricted to digits, `+-*/().` and spaces). That is model output reaching `eval`, and `9**9**9` alone
would hang a worker, so every environment built here swaps the tool for this walker of the parsed
expression. It returns what τ²'s tool returns (`str(round(float(value), 2))`) and raises the same
exceptions with the same messages, Python's own arithmetic producing both (`()` is a tuple and `...` an
Ellipsis there too, so `float` refuses them with τ²'s TypeError; `(2)(3)` is a call of an int).

Where it differs, the work is bounded by size, not by the expression's form:
- an integer of more than `MAX_BITS` bits, at any step, is refused up front (OverflowError, as `float` would
  refuse it at the end), and so is big-integer work beyond `MAX_WORK` bits over the whole expression: a
  product of allowed powers (`2**65536*2**65536*…`) is refused after one step instead of growing;
- depth never matters: a chain `1+1+…+1` or `--…-1` that CPython's parser or compiler gives up on
  (RecursionError, MemoryError, depending on the caller's own stack) is parsed here by an iterative
  precedence parser and answered; a deep expression that is not valid gives SyntaxError("invalid syntax").
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import Any

_ALLOWED_CHARS = "0123456789+-*/(). "
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_BITS = 1 << 16  # an integer this large can never become a float, which is all τ²'s tool returns
MAX_WORK = 1 << 24  # big-integer bits touched over the whole expression (about a second of CPython arithmetic)
_SMALL = 1 << 10  # integers of at most this many bits cost nothing worth counting


class _Budget:
    """Big-integer work of one expression, charged before each operation: `grow` for one whose result can be
    far larger than its operands (a power, a product), `touch` for one that cannot (its own exceptions stand)."""

    def __init__(self) -> None:
        self.work = 0

    def grow(self, bits: int) -> None:
        if bits > MAX_BITS:
            raise OverflowError("int too large to convert to float")
        self.touch(bits)

    def touch(self, bits: int) -> None:
        if bits > _SMALL:
            if self.work + bits > MAX_WORK:
                raise OverflowError("int too large to convert to float")
            self.work += bits


def _bits(value: Any) -> int:
    return abs(value).bit_length() if isinstance(value, int) and not isinstance(value, bool) else 0


def _apply(op: ast.operator, left: Any, right: Any, budget: _Budget) -> Any:
    """`left op right` as Python computes it, the result's size charged first where it can only grow."""
    a, b = _bits(left), _bits(right)
    if isinstance(op, ast.Pow) and a > 1 and b and right > 0:
        budget.grow(right * (a - 1))  # at least this many bits
    elif isinstance(op, ast.Mult) and a and b:
        budget.grow(a + b - 1)
    else:
        budget.touch(max(a, b))
    return _BINARY[type(op)](left, right)


def _value(root: ast.AST) -> Any:
    """Evaluate the tree bottom-up with an explicit stack, operands left to right as `eval` applies them."""
    budget = _Budget()
    stack: list[tuple[ast.AST, bool]] = [(root, False)]
    values: list[Any] = []
    while stack:
        node, children_done = stack.pop()
        if isinstance(node, ast.Constant):
            values.append(node.value)
        elif isinstance(node, ast.Tuple) and not node.elts:  # `()`: commas are not allowed, so only the empty one
            values.append(())
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            if not children_done:
                stack += [(node, True), (node.right, False), (node.left, False)]
                continue
            right, left = values.pop(), values.pop()
            values.append(_apply(node.op, left, right, budget))
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            if not children_done:
                stack += [(node, True), (node.operand, False)]
                continue
            values.append(_UNARY[type(node.op)](values.pop()))
        elif isinstance(node, ast.Call) and not node.keywords and (
                len(node.args) == 1 or not any(isinstance(a, ast.Starred) for a in node.args)):
            args = [a.value if isinstance(a, ast.Starred) else a for a in node.args]  # `f(*x)`: x, then unpacked
            if not children_done:  # `(2)(3)`: the callee and its arguments first, as Python evaluates them
                stack += [(node, True), *((a, False) for a in reversed(args)), (node.func, False)]
                continue
            given = values[len(values) - len(args):]
            del values[len(values) - len(args):]
            callee = values.pop()  # a number, a tuple or Ellipsis: none of them is callable
            if args and isinstance(node.args[0], ast.Starred) and not isinstance(given[0], tuple):
                raise TypeError(f"{callee} argument after * must be an iterable, not {type(given[0]).__name__}")
            raise TypeError(f"'{type(callee).__name__}' object is not callable")
        else:
            raise ValueError("Invalid expression")
    return values.pop()


# -- an iterative parser for what CPython's own cannot hold ----------------------------------------------------

_TOKEN = re.compile(r"\s*(\d+\.\d*|\.\d+|\d+|\*\*|//|[-+*/()])")
_INFIX = {"+": (1, ast.Add), "-": (1, ast.Sub), "*": (2, ast.Mult), "/": (2, ast.Div), "//": (2, ast.FloorDiv)}


def _number(text: str) -> ast.Constant:
    if re.fullmatch(r"0\d+", text) and set(text) != {"0"}:
        raise SyntaxError("invalid syntax")  # CPython: leading zeros in a decimal integer
    return ast.Constant(float(text) if "." in text else int(text))


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text.rstrip()):
        match = _TOKEN.match(text, at)
        if match is None:
            raise SyntaxError("invalid syntax")
        out.append(match.group(1))
        at = match.end()
    numbers = [t[0].isdigit() or t[0] == "." for t in out]
    if any(a and b for a, b in zip(numbers, numbers[1:], strict=False)):
        raise SyntaxError("invalid syntax")  # two numbers in a row
    return out


def _deep_parse(text: str) -> ast.AST:
    """Python's grammar for these tokens (`+ -` < `* / //` < unary `+ -` < `**`, right-associative, binding a
    unary operand on its right), with explicit stacks instead of recursion. `()` and calls are left to CPython:
    they cannot nest deep without commas."""
    tokens = _tokens(text)
    operands: list[ast.AST] = []
    pending: list[tuple[str, int]] = []  # operators not yet applied: (token, precedence)

    def reduce(down_to: int) -> None:
        while pending and pending[-1][1] >= down_to and pending[-1][0] != "(":
            token, _ = pending.pop()
            if token in ("u+", "u-"):
                operands.append(ast.UnaryOp(ast.UAdd() if token == "u+" else ast.USub(), operands.pop()))
            else:
                right, left = operands.pop(), operands.pop()
                operands.append(ast.BinOp(left, ast.Pow() if token == "**" else _INFIX[token][1](), right))

    expect_operand = True
    for token in tokens:
        if expect_operand:
            if token in "+-":
                pending.append(("u" + token, 3))
            elif token == "(":
                pending.append(("(", 0))
            elif token[0].isdigit() or token[0] == ".":
                operands.append(_number(token))
                expect_operand = False
            else:
                raise SyntaxError("invalid syntax")
        elif token == ")":
            reduce(1)
            if not pending or pending[-1][0] != "(":
                raise SyntaxError("invalid syntax")
            pending.pop()
        elif token == "**":  # right-associative, above unary: `-2**2` is -(2**2), `2**-1` takes the unary
            pending.append(("**", 4))
            expect_operand = True
        elif token in _INFIX:
            reduce(_INFIX[token][0])
            pending.append((token, _INFIX[token][0]))
            expect_operand = True
        else:
            raise SyntaxError("invalid syntax")
    if expect_operand:
        raise SyntaxError("invalid syntax")
    reduce(0)
    if pending or len(operands) != 1:
        raise SyntaxError("invalid syntax")
    return operands[0]


def _parse(text: str) -> ast.AST:
    """The expression's tree: CPython's parser (its messages are τ²'s), or ours where CPython's gives up on depth."""
    try:
        return ast.parse(text, filename="<string>", mode="eval").body
    except (RecursionError, MemoryError):
        return _deep_parse(text)


def calculate(expression: str) -> str:
    """τ²'s `calculate` semantics: allowed characters checked first, result rounded to 2 places."""
    if not all(char in _ALLOWED_CHARS for char in expression):
        raise ValueError("Invalid characters in expression")
    # `eval` strips leading spaces and tabs from a string; parsing with its filename keeps its messages.
    return str(round(float(_value(_parse(expression.lstrip(" \t")))), 2))
