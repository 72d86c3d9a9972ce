"""The contracts' expression mini-language: values against hand-computed ones, and every
forbidden construct refused (a contract file must never be able to run code)."""

from __future__ import annotations

import pytest

from minfer.contracts.expr import ExprError, parse_arith, parse_pred


@pytest.mark.parametrize(
    "text, env, value",
    [
        ("n * k * 0.5625 + k * 4 + n * 4", {"n": 1536, "k": 576}, 1536 * 576 * 0.5625 + 576 * 4 + 1536 * 4),
        ("2 * m * n * k", {"m": 3, "n": 5, "k": 7}, 210),
        ("cols // 32 * 34", {"cols": 96}, 102),
        ("cdiv(n, 32) * 18", {"n": 33}, 36),
        ("max(a, b) - min(a, b, 1)", {"a": 4, "b": 9}, 8),
        ("-n + 10 % 4", {"n": 1}, 1),
        ("0", {}, 0),
    ],
)
def test_arith_values(text, env, value):
    e = parse_arith(text)
    assert e.evaluate(env) == value
    assert e.symbols == set(env)


@pytest.mark.parametrize(
    "text, env, value",
    [
        ("divisible(k, 32)", {"k": 64}, True),
        ("divisible(k, 32)", {"k": 65}, False),
        ("divisible(k, 0)", {"k": 0}, False),
        ("m == 1", {"m": 1}, True),
        ("m > 1", {"m": 1}, False),
        ("m > 1 && divisible(k, 32)", {"m": 2, "k": 64}, True),
        ("m == 1 || k < 8", {"m": 3, "k": 4}, True),
        ("!(m > 1)", {"m": 1}, True),
        ("m != 1", {"m": 1}, False),
        ("1 <= m < 4", {"m": 4}, False),
        ("true && not false", {}, True),
    ],
)
def test_predicate_values(text, env, value):
    assert parse_pred(text).evaluate(env) is value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",  # calls other than the whitelist
        "n ** 99999999",  # power: a short text, a huge computation
        "x.shape",  # attributes
        "x[0]",  # subscripts
        "'n'",  # strings
        "lambda: 1",
        "n if m else k",
        "[n, k]",
        "n +",  # syntax
        "",
        "n" * 500,  # too long
        "min(n)",  # arity
        "cdiv(n, k=3)",  # keywords
    ],
)
def test_arith_rejects(text):
    with pytest.raises(ExprError):
        parse_arith(text)


@pytest.mark.parametrize("text", ["m", "m + 1", "divisible(k)", "open('f') == 1", "m == ", "k % 32"])
def test_predicate_rejects(text):
    with pytest.raises(ExprError):
        parse_pred(text)


def test_evaluation_errors_are_typed():
    with pytest.raises(ExprError, match="no value"):
        parse_arith("n * k").evaluate({"n": 1})
    with pytest.raises(ExprError, match="division by zero"):
        parse_arith("n / k").evaluate({"n": 1, "k": 0})
    with pytest.raises(ExprError):
        parse_arith(True)  # YAML booleans are not formulas
