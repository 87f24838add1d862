"""Arithmetic a model writes (the calculator tool's and the calculator agent's): + - * / // % ** and
parentheses on numbers, evaluated from the syntax tree, never with eval. A power whose result would
exceed MAX_RESULT_BITS is an error: a few characters such as (9**999)**999 would otherwise keep a core
busy for minutes."""

from __future__ import annotations

import ast
import math
import operator

_BINARY = {
  ast.Add: operator.add,
  ast.Sub: operator.sub,
  ast.Mult: operator.mul,
  ast.Div: operator.truediv,
  ast.FloorDiv: operator.floordiv,
  ast.Mod: operator.mod,
  ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 1000
MAX_RESULT_BITS = 10_000


def evaluate(expression: str) -> float | int:
  """The value of an arithmetic expression (thousands separators dropped, ^ read as **); ValueError
  for anything else, ArithmeticError for a division by zero or an overflow."""

  def walk(node):
    if isinstance(node, ast.Expression):
      return walk(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
      return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
      left, right = walk(node.left), walk(node.right)
      if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
        raise ValueError(f"exponent {right} is too large")
      if isinstance(node.op, ast.Pow) and right > 0 and math.log2(abs(left) or 1) * right > MAX_RESULT_BITS:
        raise ValueError(f"the result of {left:.6g} ** {right} is too large")
      return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
      return _UNARY[type(node.op)](walk(node.operand))
    raise ValueError(f"unsupported syntax {type(node).__name__}")

  try:
    tree = ast.parse(expression.replace(",", "").replace("^", "**"), mode="eval")
  except SyntaxError as e:
    raise ValueError(f"not an arithmetic expression: {expression!r}") from e
  return walk(tree)


def result_text(expression: str) -> str:
  """The expression's value as a calculator shows it (a whole float without its .0); the errors of
  `evaluate`."""
  result = evaluate(expression)
  if isinstance(result, float) and result.is_integer():
    result = int(result)
  return str(result)
