"""Tools for agentic rollouts (rl.tools): the built-ins in BUILTIN_TOOLS and your own, as Tunix tools.

Every failure (bad arguments, an exception, a timeout, a crash, an exit, too much output) comes back
as the tool's error text, which the agent puts in the tool turn; nothing raises into the rollout.
Every tool call is bounded by rl.tool_timeout_s, and a call past it is killed: nothing of it keeps
running. Every tool's output and error text is cut to rl.tool_output_max_chars (head and tail kept)
before it leaves the tool, so it is never tokenized or logged whole. A built-in tool is a Tunix
BaseTool subclass and one BUILTIN_TOOLS entry, which names the rl.tool_* limits it reads besides
those every tool reads.
- calculator: arithmetic on numbers (+ - * / // % ** and parentheses), utils/arithmetic.py's.
- python: the code runs in a fresh interpreter isolated by bubblewrap and seccomp (utils/sandbox.py), with
  wall-time, CPU-time, memory, file-size and disk limits, no new processes and no network. Where the
  sandbox cannot start, the tool refuses at start; rl.tool_sandbox=none runs the code unsandboxed on
  purpose (limits only), with a warning on every run.
- your tools (rl.tools_path) and the calculator run in worker processes (utils/worker_pool.py), not
  isolated: a call without a result after rl.tool_timeout_s comes back as an error and its worker
  is killed (SIGKILL) with any thread it started; so does sys.exit in a tool (an error, its worker
  gone); the next call gets a new worker. rl.tools_path is loaded in the trainer (for the tools'
  descriptions and schemas) and again in every worker, and a tool's output comes back as its text.
- rl.tools_path names its tools in TOOLS: a list of plain typed functions with Google-style
  docstrings (TRL's tools=[fn]) or a dict of tool name -> such a function or a Tunix BaseTool
  subclass; without TOOLS, rl.tools names its plain functions, as reward_functions names reward
  functions (user_tools). A function is a FunctionTool: its schema is transformers'
  get_json_schema's, and one it cannot build (an argument without a type hint, a docstring without
  the argument's description) is refused at start naming the file and the function.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from tunix.rl.agentic.tools import base_tool

from maxtext.configs.sections import ToolsSection
from maxtext.utils import arithmetic, sandbox, user_code, worker_pool
from maxtext.utils.errors import InputError

log = logging.getLogger(__name__)


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
      return base_tool.ToolOutput(name=self.name, output=arithmetic.result_text(value))
    except (ValueError, ArithmeticError, TypeError) as e:
      return base_tool.ToolOutput(name=self.name, error=f"{type(e).__name__}: {e}")


def python_tool(rl: ToolsSection) -> type[base_tool.BaseTool]:
  """A python tool class with the run's sandbox and limits (Tunix instantiates tool classes itself).
  InputError where rl.tool_sandbox=bwrap cannot start here."""
  if rl.tool_sandbox == "bwrap":
    try:
      sandbox.check()
    except sandbox.SandboxUnavailable as e:
      raise InputError(
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


class FunctionTool(base_tool.BaseTool):
  """A plain typed Python function with a Google-style docstring as a tool, the form TRL's
  GRPOTrainer(tools=[fn]) takes (subclasses set FUNCTION; user_tools makes them). Its schema is
  transformers.utils.get_json_schema(FUNCTION)'s, under the tool's name; a call runs FUNCTION with
  the call's arguments as keyword arguments (an async function is run to its end) and its output is
  str(result), as TRL's; arguments that do not fit FUNCTION's signature are an error, not a raise."""

  FUNCTION: Callable[..., Any]

  def get_json_schema(self) -> dict[str, Any]:
    schema = _function_schema(type(self).FUNCTION)
    return {**schema, "function": {**schema["function"], "name": self.name}}

  def apply(self, **kwargs) -> base_tool.ToolOutput:
    fn = type(self).FUNCTION
    signature = inspect.signature(fn)
    try:
      signature.bind(**kwargs)
    except TypeError as e:
      return base_tool.ToolOutput(
        name=self.name, error=f"arguments {sorted(kwargs)} do not fit {self.name}{signature}: {e}"
      )
    result = fn(**kwargs)
    if inspect.iscoroutine(result):
      result = asyncio.run(result)
    return base_tool.ToolOutput(name=self.name, output=str(result))


@functools.cache
def _function_schema(fn: Callable[..., Any]) -> dict[str, Any]:
  """transformers.utils.get_json_schema(fn) (imported here: tool workers, which only call tools,
  never load transformers); its exceptions say what fn lacks."""
  from transformers.utils import get_json_schema  # heavy; the trainer alone needs it

  return get_json_schema(fn)


def _function_tool(fn: Callable[..., Any]) -> type[FunctionTool]:
  """fn as a FunctionTool class, its docstring the class's (Tunix's tool description)."""
  return type(fn.__name__, (FunctionTool,), {"FUNCTION": staticmethod(fn), "__doc__": inspect.getdoc(fn)})


def user_tools(path: str, names: tuple[str, ...] = ()) -> dict[str, type[base_tool.BaseTool]]:
  """The tools of a Python file (rl.tools_path), by name, from its module-level TOOLS: a list of
  functions (TRL's tools=[fn, ...], each named by its __name__) or a dict of tool name -> function
  or Tunix BaseTool subclass; without TOOLS, its plain functions that `names` (rl.tools) names, as
  reward_functions names reward functions. Functions become FunctionTool classes. Any other TOOLS,
  or a file without TOOLS of which `names` names no function, is an InputError naming the file.
  Function tools' schemas are not built here (see _check_schemas)."""
  module = user_code.load_file(path, "rl.tools_path")
  found = getattr(module, "TOOLS", None)
  expected = (
    "expected TOOLS = [function, ...], a TOOLS dict of tool name -> function or BaseTool subclass, or rl.tools "
    "naming functions of the file"
  )
  if found is None:
    found = {n: getattr(module, n) for n in names if inspect.isroutine(getattr(module, n, None))}
    if not found:
      raise InputError(
        f"rl.tools_path={path}: no TOOLS, and rl.tools={list(names)} names no function of it; {expected}"
      )
  if isinstance(found, (list, tuple)):
    bad = [repr(f) for f in found if not inspect.isroutine(f)]
    if bad:
      raise InputError(f"rl.tools_path={path}: TOOLS holds {', '.join(bad)}, not a function; {expected}")
    listed = [f.__name__ for f in found]
    twice = sorted({n for n in listed if listed.count(n) > 1})
    if twice:
      raise InputError(f"rl.tools_path={path}: TOOLS names function(s) {twice} more than once")
    found = dict(zip(listed, found))
  if not isinstance(found, dict):
    raise InputError(f"rl.tools_path={path}: {expected}; got {type(found).__name__}")
  bad = [
    f"{name!r}: {tool!r}"
    for name, tool in found.items()
    if not inspect.isroutine(tool) and not (isinstance(tool, type) and issubclass(tool, base_tool.BaseTool))
  ]
  if bad:
    raise InputError(f"rl.tools_path={path}: TOOLS holds {', '.join(bad)}; {expected}")
  return {name: _function_tool(tool) if inspect.isroutine(tool) else tool for name, tool in found.items()}


def _check_schemas(path: str, mine: dict[str, type[base_tool.BaseTool]]) -> None:
  """InputError naming the file and the function where a function tool of rl.tools_path has no
  schema: an argument without a type hint, no docstring, or no description of an argument in it."""
  for cls in mine.values():
    if issubclass(cls, FunctionTool):
      fn = cls.FUNCTION
      try:
        _function_schema(fn)
      except Exception as e:
        code = getattr(fn, "__code__", None)
        line = f"{code.co_firstlineno}:" if code and os.path.abspath(code.co_filename) == os.path.abspath(path) else ""
        raise InputError(
          f"rl.tools_path={path}:{line} tool function {fn.__name__}: {' '.join(str(e).split())} (a tool "
          f"function needs a type hint on every argument and a Google-style docstring: a description, "
          f"then Args: with a line for each argument)"
        ) from e


@dataclasses.dataclass(frozen=True)
class BuiltinTool:
  """make(tools section) gives the tool's class; `limits` are the rl.tool_* keys it reads besides those every
  tool reads (rl.tool_timeout_s, rl.tool_output_max_chars); a tool that `times_itself` enforces both on its own
  (else it runs in a tool worker)."""

  make: Callable[[ToolsSection], type[base_tool.BaseTool]]
  limits: tuple[str, ...] = ()
  times_itself: bool = False


BUILTIN_TOOLS = {
  "calculator": BuiltinTool(lambda cfg: CalculatorTool),
  "python": BuiltinTool(python_tool, ("rl.tool_memory_mb", "rl.tool_sandbox"), times_itself=True),
}


def _worker_classes(
  tools: ToolsSection, mine: dict[str, type[base_tool.BaseTool]]
) -> dict[str, type[base_tool.BaseTool]]:
  """The tools of rl.tools that run in a tool worker, by name: those of rl.tools_path (`mine`, which
  replace a built-in of their name) and the built-ins that do not time themselves."""
  return {
    name: mine[name] if name in mine else BUILTIN_TOOLS[name].make(tools)
    for name in tools.names
    if name in mine or not BUILTIN_TOOLS[name].times_itself
  }


def worker_tools(tools: ToolsSection) -> Callable[[str, dict[str, Any]], tuple[str | None, str | None]]:
  """What a tool worker runs (its WorkerPool `load`): the tools of rl.tools that run in a worker, with
  rl.tools_path loaded in the worker itself, instantiated as Tunix's ToolManager does (its name, its
  class docstring as description); the handler returns a call's (output text, error text), as the
  tool turn writes them and each cut to rl.tool_output_max_chars. rl.tools names only known tools
  (tool_map checked)."""
  classes = _worker_classes(tools, user_tools(tools.tools_path, tools.names) if tools.tools_path else {})
  instances = {name: cls(name=name, description=cls.__doc__ or "") for name, cls in classes.items()}

  def cut(text) -> str | None:
    text = "" if text is None else str(text)
    return sandbox.shorten(text, tools.tool_output_max_chars) if text else None

  def run(name: str, kwargs: dict[str, Any]) -> tuple[str | None, str | None]:
    try:
      out = instances[name].apply(**kwargs)
    except Exception as e:
      return None, cut(f"{type(e).__name__}: {e}")
    if isinstance(out, base_tool.ToolOutput):
      return cut(base_tool.ToolOutput(name=name, output=out.output)), cut(out.error)
    return cut(out), None

  return run


def _in_worker(cls: type[base_tool.BaseTool], workers: worker_pool.WorkerPool) -> type[base_tool.BaseTool]:
  """cls (its name, docstring and schema) whose calls run in one of `workers`."""

  def apply(self, **kwargs) -> base_tool.ToolOutput:
    try:
      output, error = workers.call(self.name, kwargs)
    except (worker_pool.CallFailed, worker_pool.CallRaised) as e:
      output, error = None, str(e)
    return base_tool.ToolOutput(name=self.name, output=output, error=error)

  return type(cls.__name__, (cls,), {"apply": apply, "__doc__": cls.__doc__})


def tool_map(tools: ToolsSection) -> dict[str, type[base_tool.BaseTool]]:
  """rl.tools -> {name: tool class}, from BUILTIN_TOOLS and rl.tools_path; unknown names are a
  config error. The tools that do not time themselves share one WorkerPool, whose workers
  are killed when the classes are garbage-collected or the trainer exits."""
  mine = user_tools(tools.tools_path, tools.names) if tools.tools_path else {}
  _check_schemas(tools.tools_path, mine)
  if tools.tools_path and not set(mine) & set(tools.names):
    raise InputError(
      f"rl.tools_path={tools.tools_path}: agentic GRPO would ignore it, since rl.tools="
      f"{list(tools.names)} names none of its tools ({', '.join(sorted(mine))})"
    )
  available = set(BUILTIN_TOOLS) | set(mine)
  unknown = [t for t in tools.names if t not in available]
  if unknown:
    raise InputError(f"rl.tools: unknown tool(s) {unknown}; available: {sorted(available)}")
  in_worker = _worker_classes(tools, mine)
  found = {name: BUILTIN_TOOLS[name].make(tools) for name in tools.names if name not in in_worker}
  if in_worker:
    workers = worker_pool.WorkerPool(
      functools.partial(worker_tools, tools),
      tools.tool_timeout_s,
      f"rl.tool_timeout_s={tools.tool_timeout_s:g}",
      bare=("tunix",),  # tools need only tunix.rl.agentic.tools, not Tunix's trainers and JAX
    )
    found.update({name: _in_worker(cls, workers) for name, cls in in_worker.items()})
  return {name: found[name] for name in tools.names}
