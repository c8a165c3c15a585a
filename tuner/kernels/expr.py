"""Safe evaluation of the small expressions a template manifest declares.

Constraints and resource formulas are data, not code: only literals, names,
arithmetic, comparisons, boolean logic, conditional expressions and a few
pure functions are allowed.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from typing import Any, Mapping

from tuner.errors import TunerError

_FUNCTIONS = {"max": max, "min": min, "abs": abs}
_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Call,
    ast.Name, ast.Load, ast.Constant, ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd,
    ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Div, ast.Mod, ast.Pow,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Tuple,
)


@lru_cache(maxsize=512)
def _compile(text: str) -> Any:
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise TunerError(f"invalid manifest expression {text!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise TunerError(f"manifest expression {text!r} uses a forbidden construct ({type(node).__name__})")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS):
            raise TunerError(f"manifest expression {text!r} calls an unknown function")
    return compile(tree, "<manifest>", "eval")


def evaluate(text: str, names: Mapping[str, Any]) -> Any:
    """Evaluate `text` with `names` bound; unknown names are a TunerError."""
    code = _compile(text)
    try:
        return eval(code, {"__builtins__": {}}, {**_FUNCTIONS, **names})  # noqa: S307 - AST-whitelisted
    except (NameError, ArithmeticError, TypeError, ValueError) as exc:
        raise TunerError(f"manifest expression {text!r} failed: {type(exc).__name__}: {exc}") from None


def names_in(text: str) -> frozenset[str]:
    """The names `text` reads (its functions excluded): which resources a constraint refers to."""
    return frozenset(_compile(text).co_names) - _FUNCTIONS.keys()
