"""The contracts' expression mini-language: cost formulas and shape / fast-path predicates.

Two forms, both parsed with Python's `ast` and evaluated by walking a whitelist of node types
(never `eval`), so a contract file cannot run code:

- arithmetic (`cost.flops`, `cost.bytes_moved`, `cost.memory.*`, shape-rule extents):
  numbers, symbols, `+ - * / // %`, unary minus, parentheses and the calls `cdiv(a, b)`,
  `min(a, b, ...)`, `max(a, b, ...)`. No `**` (it is the one operator that turns a short text
  into a huge computation).
- predicates (`accept.inputs[].shape_constraint`, `caps.fast_paths[].when`): comparisons
  `== != < <= > >=` between arithmetic terms, `divisible(a, b)`, `true` / `false`, combined
  with `&&`, `||`, `!` (the seed's C-style spelling) or `and`, `or`, `not`.

A compiled `Expr` knows its free symbols, so the validator can check that a formula only names
declared dims and params (rule `CostUnknownSymbol`) before anything is evaluated.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass

MAX_TEXT = 400  # characters; a contract formula is one short line
MAX_NODES = 200  # AST nodes; bounds evaluation work

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMPOPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_ARITH_CALLS = {
    "cdiv": (2, 2, lambda a, b: -(-a // b)),
    "min": (2, 8, min),
    "max": (2, 8, max),
}
_PRED_CALLS = {"divisible": (2, 2, lambda a, b: b != 0 and a % b == 0)}
_PRED_NAMES = {"true": True, "false": False}


class ExprError(ValueError):
    """An expression does not parse, uses a forbidden construct, or cannot be evaluated."""


@dataclass(frozen=True)
class Expr:
    """A compiled expression: its source text, its kind ("arith" or "pred") and free symbols."""

    text: str
    kind: str
    symbols: frozenset[str]
    tree: ast.expr

    def evaluate(self, env: Mapping[str, float]) -> float | bool:
        """Value of the expression with each symbol bound by `env` (ExprError if one is missing)."""
        return _eval(self.tree, env, self.kind == "pred")


def _c_style_to_python(text: str) -> str:
    text = text.replace("&&", " and ").replace("||", " or ")
    return re.sub(r"!(?!=)", " not ", text)


@functools.lru_cache(maxsize=8192, typed=True)  # Exprs are immutable; a load asks for the same ones often
def _compile(text: object, kind: str) -> Expr:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ExprError(f"expected a string or number, found {type(text).__name__}")
    src = str(text).strip()
    if not src:
        raise ExprError("empty expression")
    if len(src) > MAX_TEXT:
        raise ExprError(f"expression longer than {MAX_TEXT} characters")
    try:
        tree = ast.parse((_c_style_to_python(src) if kind == "pred" else src).strip(), mode="eval").body
    except SyntaxError as e:
        raise ExprError(f"syntax error in {src!r}: {e.msg}") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ExprError(f"expression has more than {MAX_NODES} syntax nodes")
    symbols: set[str] = set()
    _check(tree, kind == "pred", symbols)
    return Expr(src, kind, frozenset(symbols), tree)


def parse_arith(text: object) -> Expr:
    """Compile an arithmetic cost / extent formula (ExprError if it is not one)."""
    return _compile(text, "arith")


def parse_pred(text: object) -> Expr:
    """Compile a boolean shape / fast-path predicate (ExprError if it is not one)."""
    return _compile(text, "pred")


def _check(node: ast.expr, pred: bool, symbols: set[str]) -> None:
    """Reject every node outside the whitelist; collect the free symbols.

    With `pred` the node must be boolean (comparison, divisible(), and/or/not, true/false);
    otherwise it must be arithmetic.
    """
    if pred:
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                _check(v, True, symbols)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            _check(node.operand, True, symbols)
        elif isinstance(node, ast.Compare) and all(type(o) in _CMPOPS for o in node.ops):
            for v in (node.left, *node.comparators):
                _check(v, False, symbols)
        elif isinstance(node, ast.Call):
            _check_call(node, _PRED_CALLS, symbols)
        elif not (isinstance(node, ast.Name) and node.id in _PRED_NAMES):
            raise ExprError(f"{ast.unparse(node)!r} is not a boolean condition")
        return
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ExprError(f"only numeric constants are allowed, found {node.value!r}")
    elif isinstance(node, ast.Name):
        symbols.add(node.id)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        _check(node.left, False, symbols)
        _check(node.right, False, symbols)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _check(node.operand, False, symbols)
    elif isinstance(node, ast.Call):
        _check_call(node, _ARITH_CALLS, symbols)
    else:
        raise ExprError(f"{ast.unparse(node)!r} is not allowed in an arithmetic expression")


def _check_call(node: ast.Call, calls: dict, symbols: set[str]) -> None:
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name not in calls:
        raise ExprError(f"unknown function {ast.unparse(node.func)!r}; allowed: {', '.join(calls)}")
    lo, hi, _ = calls[name]
    if node.keywords or not lo <= len(node.args) <= hi:
        raise ExprError(f"{name}() takes {lo}..{hi} positional arguments")
    for a in node.args:
        _check(a, False, symbols)


def _eval(node: ast.expr, env: Mapping[str, float], pred: bool):
    """Evaluate a node that `_check` accepted (same `pred` flag)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if pred:
            return _PRED_NAMES[node.id]
        if node.id not in env:
            raise ExprError(f"symbol {node.id!r} has no value (known: {', '.join(sorted(env)) or 'none'})")
        return env[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env, False), _eval(node.right, env, False)
        try:
            return _BINOPS[type(node.op)](a, b)
        except ZeroDivisionError:
            raise ExprError(f"division by zero in {ast.unparse(node)!r}") from None
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            return not _eval(node.operand, env, True)
        v = _eval(node.operand, env, False)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Call):
        _, _, fn = (_PRED_CALLS if pred else _ARITH_CALLS)[node.func.id]
        try:
            return fn(*(_eval(a, env, False) for a in node.args))
        except ZeroDivisionError:
            raise ExprError(f"division by zero in {ast.unparse(node)!r}") from None
    if isinstance(node, ast.BoolOp):
        vals = (_eval(v, env, True) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    left = _eval(node.left, env, False)  # ast.Compare, the only node left
    for op, right_node in zip(node.ops, node.comparators, strict=True):
        right = _eval(right_node, env, False)
        if not _CMPOPS[type(op)](left, right):
            return False
        left = right
    return True


def is_finite_number(v: object) -> bool:
    """True for int/float values that are finite (bools excluded)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
