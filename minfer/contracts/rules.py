"""Evaluate a contract's operand rules for a concrete call.

- `accepts_dtype`: an input's `dtypes` entry is a dtype name, or `same_as(NAME)` (minfer
  extension: this input must have the dtype of the earlier input NAME, e.g. SwiGLU's `up` has
  `gate`'s dtype); a quant operand matches by storage type against `fdx.quant.ggml_dtype`;
- `output_dtype` / `output_shape`: `return.outputs[i].dtype_rule` / `shape_rule`
  (`fixed(DT)`, `same_as(x)`, `dequant(w)` -> F32, `param(field)`; `same_as(x)`,
  `matmul(a, w)` -> a's leading dims + [n], `leading(x, e)` -> x's leading dims + [e],
  `from_params(e, ...)` -> [e, ...]; every e is an arithmetic expression of the call's dims).

The picker, the conformance harness and the judge all go through these, so a rule means one
thing everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .expr import ExprError, parse_arith
from .ops import STORAGE_TYPES, OpSpec, dtype_name
from .schema import InputSpec, KernelContract

_SAME_AS = re.compile(r"\s*same_as\(\s*([A-Za-z_]\w*)\s*\)\s*\Z")
_CALL = re.compile(r"\s*([A-Za-z_]\w*)\s*\((.*)\)\s*\Z")


def same_as_target(entry: str) -> str | None:
    """NAME for a `same_as(NAME)` dtypes entry, else None."""
    m = _SAME_AS.match(entry)
    return m.group(1) if m else None


def split_call(text: str) -> tuple[str, list[str]] | None:
    """`name(a, b(c, d), e)` -> ("name", ["a", "b(c, d)", "e"]); None if not a call."""
    m = _CALL.match(text)
    if not m:
        return None
    args, depth, cur = [], 0, ""
    for ch in m.group(2):
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return None
        cur += ch
    if cur.strip():
        args.append(cur.strip())
    return m.group(1), args


def call_env(spec: OpSpec, shapes: Mapping[str, tuple[int, ...]], params: Mapping[str, Any]) -> dict:
    """The symbols of a call: its numeric params and the op's dims (KeyError/ValueError/TypeError/
    IndexError when the shapes or params do not fit the op)."""
    env = {k: v for k, v in params.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    env.update(spec.dims_of(shapes, params))
    return env


def norm_dtype(d: Any) -> str:
    """A dtype given as torch dtype / name / storage type, in contract spelling (str(d) if unknown)."""
    if isinstance(d, str) and d in STORAGE_TYPES:
        return d
    try:
        return dtype_name(d)
    except KeyError:
        return str(d)


def accepts_dtype(inp: InputSpec, dtype: str, dtypes: Mapping[str, str]) -> str | None:
    """None if input `inp` accepts `dtype` (given the call's other input dtypes), else why not."""
    q = inp.quant
    if q is not None:
        if dtype not in q.ggml_dtypes:
            return f"{inp.name}: storage type {dtype} not in {list(q.ggml_dtypes)}"
        return None
    allowed = [dtypes.get(same_as_target(e) or "", "?") if same_as_target(e) else e for e in inp.dtypes]
    if dtype not in allowed:
        return f"{inp.name}: dtype {dtype} not in {list(inp.dtypes)} (here {allowed})"
    return None


def output_dtype(
    c: KernelContract, dtypes: Mapping[str, str], params: Mapping[str, Any], i: int = 0
) -> str | None:
    """Dtype name of output `i` under its dtype_rule (None if the rule cannot say)."""
    call = split_call(c.outputs[i].dtype_rule)
    if not call or len(call[1]) != 1:
        return None
    fn, arg = call[0], call[1][0]
    if fn == "fixed":
        return arg
    if fn == "same_as":
        return dtypes.get(arg)
    if fn == "dequant":
        return "F32"
    if fn == "param" and arg in params:
        return norm_dtype(params[arg])
    return None


def output_shape(
    c: KernelContract, shapes: Mapping[str, tuple[int, ...]], env: Mapping[str, float], i: int = 0
) -> tuple[int, ...]:
    """Shape of output `i` under its shape_rule (ValueError if it cannot be evaluated)."""
    call = split_call(c.outputs[i].shape_rule)
    if not call:
        raise ValueError(f"shape_rule {c.outputs[i].shape_rule!r} is not a rule call")
    fn, args = call
    if fn == "same_as":
        return tuple(shapes[args[0]])
    if fn == "matmul":
        return tuple(shapes[args[0]][:-1]) + (_extent("n", env),)
    if fn == "leading":
        return tuple(shapes[args[0]][:-1]) + (_extent(args[1], env),)
    if fn == "from_params":
        return tuple(_extent(a, env) for a in args)
    raise ValueError(f"unknown shape rule {fn}()")


def _extent(text: str, env: Mapping[str, float]) -> int:
    try:
        v = parse_arith(text).evaluate(env)
    except ExprError as e:
        raise ValueError(str(e)) from None
    if v != int(v) or v < 0:
        raise ValueError(f"extent {text!r} = {v} is not a non-negative integer")
    return int(v)
