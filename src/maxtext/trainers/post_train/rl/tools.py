"""Tools for agentic rollouts (rl.tools): the built-ins in BUILTIN_TOOLS and your own, as Tunix tools.

Every failure (bad arguments, an exception, a timeout, a crash, too much output) comes back as the
tool's error text, which the agent puts in the tool turn; nothing raises into the rollout. Every
tool call is bounded by rl.tool_timeout_s. A built-in tool is a Tunix BaseTool subclass and one
BUILTIN_TOOLS entry, which names the rl.tool_* limits it reads.
- calculator: arithmetic on numbers (+ - * / // % ** and parentheses), evaluated from the syntax
  tree, never with eval; a power whose result would exceed MAX_RESULT_BITS is an error (a few
  characters such as (9**999)**999 would otherwise keep a core busy for minutes).
- python: the code runs in a fresh interpreter isolated by bubblewrap and seccomp (sandbox.py), with
  wall-time, CPU-time, memory, file-size and disk limits, no new processes and no network, its
  output cut to rl.tool_output_max_chars (head and tail kept). Where the sandbox cannot start, the
  tool refuses at start; rl.tool_sandbox=none runs the code unsandboxed on purpose (limits only),
  with a warning on every run.
- your tools (rl.tools_path) run in the trainer's process, not isolated. A call without a result
  after rl.tool_timeout_s comes back as an error (its thread is left to finish on its own); so does
  a calculator's.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import logging
import math
import operator
import threading
from collections.abc import Callable
from typing import Any

from tunix.rl.agentic.tools import base_tool

from maxtext.configs.sections import ToolsSection
from maxtext.trainers.post_train.rl import sandbox
from maxtext.utils import user_code
from maxtext.utils.errors import ConfigError

log = logging.getLogger(__name__)

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


def evaluate_arithmetic(expression: str) -> float | int:
  """The value of an arithmetic expression; ValueError for anything else."""

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


class _OneArgumentTool(base_tool.BaseTool):
  """A tool taking one string argument named PARAM; other arguments are an error, not a raise."""

  PARAM = ""
  PARAM_DESCRIPTION = ""

  def get_json_schema(self) -> dict[str, Any]:
    return {
      "type": "function",
      "function": {
        "name": self.name,
        "description": self.description,
        "parameters": {
          "type": "object",
          "required": [self.PARAM],
          "properties": {self.PARAM: {"type": "string", "description": self.PARAM_DESCRIPTION}},
        },
      },
    }

  def apply(self, **kwargs) -> base_tool.ToolOutput:
    if set(kwargs) != {self.PARAM}:
      return base_tool.ToolOutput(name=self.name, error=f"got arguments {sorted(kwargs)}; expected {self.PARAM}")
    return self.run(str(kwargs[self.PARAM]))

  def run(self, value: str) -> base_tool.ToolOutput:
    raise NotImplementedError


class CalculatorTool(_OneArgumentTool):
  """Evaluates an arithmetic expression such as (48 / 2) * 3 + 1."""

  PARAM = "expression"
  PARAM_DESCRIPTION = "arithmetic expression, e.g. (48 / 2) * 3"

  def run(self, value: str) -> base_tool.ToolOutput:
    try:
      result = evaluate_arithmetic(value)
    except (ValueError, ArithmeticError, TypeError) as e:
      return base_tool.ToolOutput(name=self.name, error=f"{type(e).__name__}: {e}")
    if isinstance(result, float) and result.is_integer():
      result = int(result)
    return base_tool.ToolOutput(name=self.name, output=str(result))


def python_tool(rl: ToolsSection) -> type[base_tool.BaseTool]:
  """A python tool class with the run's sandbox and limits (Tunix instantiates tool classes itself).
  ConfigError where rl.tool_sandbox=bwrap cannot start here."""
  if rl.tool_sandbox == "bwrap":
    try:
      sandbox.check()
    except sandbox.SandboxUnavailable as e:
      raise ConfigError(
        f"rl.tools=[python] runs model-written code in a bubblewrap sandbox, which cannot start "
        f"here: {e}. rl.tool_sandbox=none runs it unsandboxed (no isolation from the trainer, its "
        f"files or the network)"
      ) from None
  else:
    log.warning(
      "rl.tool_sandbox=none: the python tool runs model-written code UNSANDBOXED, as the trainer's user, "
      "with access to its files and the network"
    )

  class PythonTool(_OneArgumentTool):
    """Runs Python code and returns what it prints."""

    PARAM = "code"
    PARAM_DESCRIPTION = "Python source; print the result"

    def run(self, value: str) -> base_tool.ToolOutput:
      output, error = sandbox.run(
        value,
        rl.tool_sandbox == "bwrap",
        rl.tool_timeout_s,
        int(rl.tool_timeout_s) + 1,
        rl.tool_memory_mb,
        rl.tool_output_max_chars,
      )
      return base_tool.ToolOutput(name=self.name, output=output, error=error)

  return PythonTool


def with_deadline(cls: type[base_tool.BaseTool], timeout_s: float) -> type[base_tool.BaseTool]:
  """cls whose calls come back as an error when they take longer than timeout_s seconds."""

  def apply(self, **kwargs) -> base_tool.ToolOutput:
    result = []

    def call():
      try:
        result.append(cls.apply(self, **kwargs))
      except Exception as e:
        result.append(e)

    worker = threading.Thread(target=call, name=f"tool-{self.name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not result:
      return base_tool.ToolOutput(name=self.name, error=f"no result within rl.tool_timeout_s={timeout_s:g} s")
    if isinstance(result[0], Exception):
      raise result[0]  # in the caller's thread, where Tunix's tool manager turns it into the error text
    return result[0]

  return type(cls.__name__, (cls,), {"apply": apply, "__doc__": cls.__doc__})


def user_tools(path: str) -> dict[str, type[base_tool.BaseTool]]:
  """The TOOLS dict of a Python file (rl.tools_path): tool name -> Tunix BaseTool subclass."""
  found = getattr(user_code.load_file(path, "rl.tools_path"), "TOOLS", None)
  if not isinstance(found, dict) or not all(
    isinstance(c, type) and issubclass(c, base_tool.BaseTool) for c in found.values()
  ):
    raise ConfigError(f"rl.tools_path={path}: expected a TOOLS dict of tool name -> BaseTool subclass")
  return found


@dataclasses.dataclass(frozen=True)
class BuiltinTool:
  """make(tools section) gives the tool's class; `limits` are the rl.tool_* keys besides rl.tool_timeout_s it
  reads; a tool that `times_itself` enforces rl.tool_timeout_s on its own (else a deadline thread does)."""

  make: Callable[[ToolsSection], type[base_tool.BaseTool]]
  limits: tuple[str, ...] = ()
  times_itself: bool = False


BUILTIN_TOOLS = {
  "calculator": BuiltinTool(lambda cfg: CalculatorTool),
  "python": BuiltinTool(
    python_tool, ("rl.tool_memory_mb", "rl.tool_output_max_chars", "rl.tool_sandbox"), times_itself=True
  ),
}


def _bounded(tool: BuiltinTool, cfg: ToolsSection) -> type[base_tool.BaseTool]:
  cls = tool.make(cfg)
  return cls if tool.times_itself else with_deadline(cls, cfg.tool_timeout_s)


def tool_map(cfg: ToolsSection) -> dict[str, type[base_tool.BaseTool]]:
  """rl.tools -> {name: tool class}, from BUILTIN_TOOLS and rl.tools_path; unknown names are a
  config error."""
  timeout = cfg.tool_timeout_s
  available: dict[str, Callable[[], type[base_tool.BaseTool]]] = {
    name: functools.partial(_bounded, tool, cfg) for name, tool in BUILTIN_TOOLS.items()
  }
  if cfg.tools_path:
    mine = user_tools(cfg.tools_path)
    if not set(mine) & set(cfg.names):
      raise ConfigError(
        f"rl.tools_path={cfg.tools_path}: agentic GRPO would ignore it, since rl.tools="
        f"{list(cfg.names)} names none of its tools ({', '.join(sorted(mine))})"
      )
    available.update({name: functools.partial(with_deadline, c, timeout) for name, c in mine.items()})
  unknown = [t for t in cfg.names if t not in available]
  if unknown:
    raise ConfigError(f"rl.tools: unknown tool(s) {unknown}; available: {sorted(available)}")
  return {name: available[name]() for name in cfg.names}
