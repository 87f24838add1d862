"""Agentic tools: arithmetic by hand, every python-tool failure mode as an error, never a raise, and
the other tools' calls in worker processes that are killed at rl.tool_timeout_s."""

import gc
import os
import signal
import threading
import time

import pytest

from maxtext.configs import pyconfig
from maxtext.integration.tunix import tools
from maxtext.utils import errors
from tests.conftest import make_config

CFG = make_config(
  "rl.use_agentic_rollout=true", "rl.tools=[calculator, python]", "rl.tool_timeout_s=2", "rl.tool_output_max_chars=100"
)


@pytest.mark.parametrize(
  "expression, value",
  [
    ("48 / 2 + 24", "48"),
    ("(3 + 4) * 5", "35"),
    ("-2 ** 3", "-8"),
    ("7 // 2", "3"),
    ("1,234 + 1", "1235"),
    ("2^10", "1024"),
    ("0.5 * 3", "1.5"),
  ],
)
def test_calculator(expression, value):
  calc = tools.CalculatorTool("calculator", "calc")
  out = calc.apply(expression=expression)
  assert out.error is None and out.output == value


@pytest.mark.parametrize(
  "expression, error",
  [
    ("__import__('os').system('ls')", "unsupported syntax"),
    ("1 / 0", "ZeroDivisionError"),
    ("2 ** 100000", "exponent"),
    ("1 +", "not an arithmetic expression"),
  ],
)
def test_calculator_errors(expression, error):
  out = tools.CalculatorTool("calculator", "calc").apply(expression=expression)
  assert out.output is None and error in out.error


def test_calculator_wrong_arguments():
  assert "got arguments ['x']; expected expression" in tools.CalculatorTool("calculator", "c").apply(x="1").error
  assert "got arguments []" in tools.CalculatorTool("calculator", "c").apply().error


@pytest.fixture(scope="module")
def python():
  cls = tools.tool_map(CFG.tools)["python"]
  return cls("python", "run python")


@pytest.mark.parametrize(
  "code, output, error",
  [
    ("print(6 * 7)", "42\n", None),
    ("import os; print(os.listdir('.'))", "[]\n", None),  # an empty folder
    ("raise ValueError('bad')", "", "ValueError: bad"),  # a raise
    ("while True: pass", "", "timed out after 2 s"),  # a hang
    ("x = bytearray(2 << 30)", "", "MemoryError"),  # memory limit
    ("import socket; socket.create_connection(('1.1.1.1', 80))", "", "Address family not supported"),
    ("import os; os.kill(os.getpid(), 9)", "", "killed by signal 9"),  # a crash
  ],
)
def test_python_tool(python, code, output, error):
  out = python.apply(code=code)
  assert out.output == output or (not out.output and output == "")
  if error is None:
    assert out.error is None
  else:
    assert error in out.error


def test_python_output_is_truncated(python):
  out = python.apply(code="print('x' * 10_000)")
  assert out.error is None and out.output.startswith("x" * 50) and "[output truncated: 10001 characters]" in out.output
  assert len(out.output) < 150


def test_unknown_tool_is_a_config_error():
  with pytest.raises(ValueError, match=r"rl.tools: unknown tool\(s\) \['browser'\]"):
    tools.tool_map(make_config("rl.use_agentic_rollout=true", "rl.tools=[browser]").tools)


def test_user_tools_from_tools_path(tmp_path):
  path = tmp_path / "my_tools.py"
  path.write_text(
    "from tunix.rl.agentic.tools import base_tool\n"
    "class Echo(base_tool.BaseTool):\n"
    "  def get_json_schema(self):\n"
    "    return {'type': 'function', 'function': {'name': self.name, 'parameters': {}}}\n"
    "  def apply(self, **kwargs):\n"
    "    return base_tool.ToolOutput(name=self.name, output=str(kwargs))\n"
    "TOOLS = {'echo': Echo}\n"
  )
  found = tools.tool_map(
    make_config("rl.use_agentic_rollout=true", "rl.tools=[calculator, echo]", f"rl.tools_path={path}").tools
  )
  assert sorted(found) == ["calculator", "echo"] and found["echo"].__name__ == "Echo"
  with pytest.raises(
    errors.InputError,
    match=r"rl.tools: unknown tool\(s\) \['nope'\]; available: "
    r"\['calculator', 'echo', 'python'\]",
  ):
    tools.tool_map(make_config("rl.use_agentic_rollout=true", "rl.tools=[echo, nope]", f"rl.tools_path={path}").tools)
  (tmp_path / "bad.py").write_text("TOOLS = {'x': 1}\n")
  with pytest.raises(errors.InputError, match="TOOLS holds .x.: 1; expected TOOLS = "):
    tools.tool_map(
      make_config("rl.use_agentic_rollout=true", "rl.tools=[x]", f"rl.tools_path={tmp_path / 'bad.py'}").tools
    )
  with pytest.raises(FileNotFoundError, match="missing.py: file not found"):
    tools.tool_map(
      make_config("rl.use_agentic_rollout=true", "rl.tools=[x]", f"rl.tools_path={tmp_path / 'missing.py'}").tools
    )


def test_user_tool_that_hangs_or_raises_comes_back_as_an_error(tmp_path):
  """rl.tools_path tools run under rl.tool_timeout_s; Tunix's tool manager runs them as the
  environment does. A worker process that exits without a result is an error too, and the next call
  gets a new one."""
  from tunix.rl.agentic.tools import tool_manager

  path = tmp_path / "slow_tools.py"
  path.write_text(
    "import os, sys, time\n"
    "from tunix.rl.agentic.tools import base_tool\n"
    "class Nap(base_tool.BaseTool):\n"
    "  '''Sleeps for `s` seconds, or raises when s is negative.'''\n"
    "  def get_json_schema(self):\n"
    "    return {'type': 'function', 'function': {'name': self.name, 'parameters': {}}}\n"
    "  def apply(self, s):\n"
    "    if s == -2:\n"
    "      os._exit(3)\n"
    "    if s == -3:\n"
    "      sys.exit(0)\n"
    "    if s < 0:\n"
    "      raise RuntimeError('negative nap')\n"
    "    time.sleep(s)\n"
    "    return base_tool.ToolOutput(name=self.name, output=f'slept {s}')\n"
    "TOOLS = {'nap': Nap}\n"
  )
  manager = tool_manager.ToolManager(
    tools.tool_map(
      make_config(
        "rl.use_agentic_rollout=true", "rl.tools=[nap]", f"rl.tools_path={path}", "rl.tool_timeout_s=0.5"
      ).tools
    )
  )
  assert manager.get_tools()[0].description.startswith("Sleeps for")
  assert manager.run("nap", s=0.01).output == "slept 0.01"
  start = time.perf_counter()
  hung = manager.run("nap", s=30)
  assert time.perf_counter() - start < 5 and hung.error == "no result within rl.tool_timeout_s=0.5 s"
  assert manager.run("nap", s=-1).error == "RuntimeError: negative nap"
  assert manager.run("nap", s=-2).error == "its worker process ended without a result (exit code 3)"
  assert manager.run("nap", s=-3).error == "called sys.exit(0)"
  assert manager.run("nap", s=0.01).output == "slept 0.01"


SPIN_TOOLS = """
import os, sys
from tunix.rl.agentic.tools import base_tool
class Spin(base_tool.BaseTool):
  '''Spins forever when asked to; otherwise says which process runs it and whether JAX is loaded there.'''
  def get_json_schema(self):
    return {'type': 'function', 'function': {'name': self.name, 'parameters': {}}}
  def apply(self, spin=False):
    while spin:
      pass
    return base_tool.ToolOutput(name=self.name, output=f"{os.getpid()} {'jax' in sys.modules}")
TOOLS = {'spin': Spin}
"""


def _alive(pid: int) -> bool:
  return os.path.exists(f"/proc/{pid}")


def _children() -> set[int]:
  """The pids of this process's child processes."""
  found = set()
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat") as f:
        stat = f.read()
    except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
      continue
    if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
      found.add(int(entry))
  return found


def _spin_tool(tmp_path, timeout_s):
  path = tmp_path / "spin_tools.py"
  path.write_text(SPIN_TOOLS)
  cfg = make_config(
    "rl.use_agentic_rollout=true", "rl.tools=[spin]", f"rl.tools_path={path}", f"rl.tool_timeout_s={timeout_s}"
  )
  return tools.tool_map(cfg.tools)["spin"]("spin", "spins")


def test_a_user_tool_past_the_timeout_is_killed_with_its_worker_process(tmp_path):
  """A user tool that spins forever: its call comes back as the timeout error, its worker process is
  gone, the trainer's process runs no thread for it and burns no CPU afterwards, and a new worker
  serves the next call. The workers end when the tool classes are garbage-collected."""
  spin = _spin_tool(tmp_path, 0.5)
  threads = threading.active_count()
  pid, jax_loaded = spin.apply().output.split()
  pid = int(pid)
  assert pid != os.getpid() and _alive(pid) and jax_loaded == "False"  # a worker starts without JAX
  start = time.perf_counter()
  out = spin.apply(spin=True)
  assert out.error == "no result within rl.tool_timeout_s=0.5 s" and time.perf_counter() - start < 3
  assert not _alive(pid) and threading.active_count() == threads
  cpu = time.process_time()
  time.sleep(0.5)
  assert time.process_time() - cpu < 0.1
  new = int(spin.apply().output.split()[0])
  assert new != pid and _alive(new)
  del spin
  gc.collect()
  assert not _alive(new)


def test_calls_at_once_do_not_wait_for_a_hung_one(tmp_path):
  """Concurrent calls (agentic rollouts call tools from many threads) each get a worker of their own."""
  spin = _spin_tool(tmp_path, 1.5)
  hung = threading.Thread(target=spin.apply, kwargs={"spin": True})
  hung.start()
  time.sleep(0.2)
  start = time.perf_counter()
  assert spin.apply().error is None and time.perf_counter() - start < 1
  hung.join()


def test_a_power_too_large_to_compute_quickly_is_an_error():
  """A few characters of model output must not keep the trainer's core busy: (9**999)**999 has
  about 3 million bits."""
  start = time.perf_counter()
  out = tools.CalculatorTool("calculator", "calc").apply(expression="(9 ** 999) ** 999")
  assert out.output is None and "too large" in out.error and time.perf_counter() - start < 1
  assert tools.CalculatorTool("calculator", "calc").apply(expression="2 ** 1000").output == str(2**1000)


def test_every_builtin_tool_is_bounded_by_the_timeout_and_its_limits_are_the_ones_the_config_accepts():
  """Each built-in tool is bounded by rl.tool_timeout_s (a calculator call whose worker process hangs
  comes back as the timeout error, and the worker is killed), and the config accepts exactly the
  rl.tool_* limits its BUILTIN_TOOLS entry names."""
  calc = tools.tool_map(
    make_config("rl.use_agentic_rollout=true", "rl.tools=[calculator]", "rl.tool_timeout_s=0.2").tools
  )["calculator"]("calculator", "calc")
  before = _children()
  assert calc.apply(expression="1 + 1").output == "2"
  (worker,) = _children() - before  # the calculator runs in a worker process
  os.kill(worker, signal.SIGSTOP)  # which now hangs
  start = time.perf_counter()
  out = calc.apply(expression="1 + 1")
  assert out.error == "no result within rl.tool_timeout_s=0.2 s" and time.perf_counter() - start < 2
  assert not _alive(worker) and calc.apply(expression="2 * 3").output == "6"
  all_limits = {key for tool in tools.BUILTIN_TOOLS.values() for key in tool.limits}
  values = {"rl.tool_memory_mb": 64, "rl.tool_output_max_chars": 100, "rl.tool_sandbox": "none"}
  for name, tool in tools.BUILTIN_TOOLS.items():
    base = ("rl.use_agentic_rollout=true", f"rl.tools=[{name}]", "rl.tool_timeout_s=1.5")
    for key in all_limits:
      if key in tool.limits:
        make_config(*base, f"{key}={values[key]}")
      else:
        with pytest.raises(pyconfig.ConfigError, match=key):
          make_config(*base, f"{key}={values[key]}")


# TRL's form: plain typed functions with Google-style docstrings, as GRPOTrainer(tools=[fn]) takes them.
TRL_TOOLS = '''
import asyncio, os, sys, time


def add(a: int, b: int) -> int:
  """Adds two integers.

  Args:
    a: the first integer
    b: the second integer
  """
  return a + b


async def shout(text: str) -> str:
  """Says the text louder.

  Args:
    text: what to say
  """
  await asyncio.sleep(0)
  return text.upper() + "!"


def where() -> str:
  """Says which process runs it and whether transformers or JAX is loaded there."""
  return f"{os.getpid()} {'transformers' in sys.modules} {'jax' in sys.modules}"


def nap(seconds: float) -> str:
  """Sleeps, then prints a lot.

  Args:
    seconds: how long to sleep
  """
  if seconds < 0:
    raise ValueError("negative nap")
  time.sleep(seconds)
  return "z" * 1000


TOOLS = [add, shout, where, nap]
'''


def _trl_tools(tmp_path, *overrides):
  path = tmp_path / "my_tools.py"
  path.write_text(TRL_TOOLS)
  cfg = make_config(
    "rl.use_agentic_rollout=true", "rl.tools=[add, shout, where, nap]", f"rl.tools_path={path}", *overrides
  )
  return path, tools.tool_map(cfg.tools)


def test_trl_style_function_tools_load_with_transformers_schemas_and_run_in_workers(tmp_path):
  """TOOLS = [fn, ...]: each function is a tool named as the function, its schema the one
  transformers.utils.get_json_schema builds, its calls run in a worker process (which loads neither
  transformers nor JAX) with the call's arguments as keywords, and its output is the result's text;
  an async function is run to its end."""
  import importlib.util

  from transformers.utils import get_json_schema
  from tunix.rl.agentic.tools import tool_manager

  path, found = _trl_tools(tmp_path)
  spec = importlib.util.spec_from_file_location("trl_tools_for_test", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  manager = tool_manager.ToolManager(found)
  assert manager.get_json_schema() == [get_json_schema(fn) for fn in module.TOOLS]
  assert manager.get_tools()[0].description.startswith("Adds two integers.")
  assert manager.run("add", a=2, b=40).output == "42"
  assert manager.run("shout", text="hi").output == "HI!"
  pid, transformers_loaded, jax_loaded = manager.run("where").output.split()
  assert int(pid) != os.getpid() and (transformers_loaded, jax_loaded) == ("False", "False")


def test_without_tools_rl_tools_names_plain_functions_of_the_file_as_reward_functions_are_named(tmp_path):
  """A TRL-style tools file without TOOLS: `rl.tools=[add, shout]` names its functions (the others are
  not tools); a name the file lacks is refused naming the available ones, and a file of which rl.tools
  names no function is refused naming the file."""
  from tunix.rl.agentic.tools import tool_manager

  path = tmp_path / "plain_tools.py"
  path.write_text(TRL_TOOLS.replace("TOOLS = [add, shout, where, nap]", ""))
  found = tools.tool_map(
    make_config("rl.use_agentic_rollout=true", "rl.tools=[add, shout]", f"rl.tools_path={path}").tools
  )
  assert sorted(found) == ["add", "shout"]
  manager = tool_manager.ToolManager(found)
  assert manager.run("add", a=2, b=40).output == "42" and manager.run("shout", text="hi").output == "HI!"
  with pytest.raises(
    errors.InputError, match=r"rl.tools: unknown tool\(s\) \['mul'\]; available: \['add', 'calculator'"
  ):
    tools.tool_map(make_config("rl.use_agentic_rollout=true", "rl.tools=[add, mul]", f"rl.tools_path={path}").tools)
  with pytest.raises(
    errors.InputError, match=rf"rl.tools_path={path}: no TOOLS, and rl.tools=\['calculator'\] names no function"
  ):
    tools.tool_map(make_config("rl.use_agentic_rollout=true", "rl.tools=[calculator]", f"rl.tools_path={path}").tools)


def test_function_tool_calls_with_arguments_that_do_not_fit_are_tool_errors(tmp_path):
  """What the model sees as the tool turn: an error naming the arguments and the signature; the
  next call works."""
  from tunix.rl.agentic.tools import tool_manager

  manager = tool_manager.ToolManager(_trl_tools(tmp_path)[1])
  assert manager.run("add", a=1).error == (
    "arguments ['a'] do not fit add(a: int, b: int) -> int: missing a required argument: 'b'"
  )
  assert manager.run("add", a=1, b=2, c=3).error == (
    "arguments ['a', 'b', 'c'] do not fit add(a: int, b: int) -> int: got an unexpected keyword argument 'c'"
  )
  assert "do not fit add" in manager.run("add", invalid_arguments="1+2").error  # arguments not a JSON object
  assert manager.run("add", a="1", b="2").output == "12"  # Python's own answer to the types it got
  assert str(manager.run("nap", seconds=-1)) == "Error: ValueError: negative nap"
  assert manager.run("add", a=1, b=2).output == "3"


def test_function_tools_obey_the_tool_timeout_and_the_output_cap(tmp_path):
  """rl.tool_timeout_s and rl.tool_output_max_chars bound function tools as they bound BaseTool ones."""
  _, found = _trl_tools(tmp_path, "rl.tool_timeout_s=0.5", "rl.tool_output_max_chars=100")
  nap = found["nap"]("nap", "naps")
  out = nap.apply(seconds=0)
  assert out.error is None and out.output.startswith("z" * 40) and "[output truncated: 1000 characters]" in out.output
  assert len(out.output) < 150
  start = time.perf_counter()
  assert nap.apply(seconds=30).error == "no result within rl.tool_timeout_s=0.5 s"
  assert time.perf_counter() - start < 5
  assert nap.apply(seconds=0).error is None


MIXED_TOOLS = '''
from tunix.rl.agentic.tools import base_tool


def add(a: int, b: int) -> int:
  """Adds two integers.

  Args:
    a: the first integer
    b: the second integer
  """
  return a + b


class Echo(base_tool.BaseTool):
  """Echoes its arguments."""

  def get_json_schema(self):
    return {"type": "function", "function": {"name": self.name, "parameters": {}}}

  def apply(self, **kwargs):
    return base_tool.ToolOutput(name=self.name, output=str(kwargs))


TOOLS = {"plus": add, "echo": Echo}
'''


def test_a_tools_dict_may_mix_functions_and_basetool_classes(tmp_path):
  """A dict names each tool: a function is the tool of its key (its schema under that name)."""
  from tunix.rl.agentic.tools import tool_manager

  path = tmp_path / "mixed.py"
  path.write_text(MIXED_TOOLS)
  cfg = make_config("rl.use_agentic_rollout=true", "rl.tools=[plus, echo]", f"rl.tools_path={path}")
  manager = tool_manager.ToolManager(tools.tool_map(cfg.tools))
  plus, echo = manager.get_json_schema()
  assert plus["function"]["name"] == "plus" and plus["function"]["description"] == "Adds two integers."
  assert echo == {"type": "function", "function": {"name": "echo", "parameters": {}}}
  assert manager.run("plus", a=2, b=3).output == "5"
  assert manager.run("echo", x=1).output == "{'x': 1}"


@pytest.mark.parametrize(
  "source, missing",
  [
    ('def f(x) -> int:\n  """F.\n\n  Args:\n    x: a number\n  """\n  return x\n', "Argument x is missing a type hint"),
    ("def f(x: int) -> int:\n  return x\n", "it has no docstring"),
    ('def f(x: int) -> int:\n  """F."""\n  return x\n', "the docstring has no description for the argument 'x'"),
  ],
)
def test_a_tool_function_without_type_hints_or_docstring_args_is_refused_naming_it(tmp_path, source, missing):
  path = tmp_path / "bad_tools.py"
  path.write_text("import math\n\n" + source + "\nTOOLS = [f]\n")
  with pytest.raises(errors.InputError) as raised:
    tools.tool_map(make_config("rl.use_agentic_rollout=true", "rl.tools=[f]", f"rl.tools_path={path}").tools)
  message = str(raised.value)
  assert message.startswith(f"rl.tools_path={path}:3: tool function f: ") and missing in message
  assert "\n" not in message


@pytest.mark.parametrize(
  "tools_line, expected",
  [
    ("TOOLS = [add, add]", r"TOOLS names function\(s\) \['add'\] more than once"),
    ("TOOLS = [add, 3]", "TOOLS holds 3, not a function"),
    ("TOOLS = add", "expected TOOLS = .*; got function"),
  ],
)
def test_a_tools_file_whose_tools_are_neither_functions_nor_basetool_classes_is_refused(tmp_path, tools_line, expected):
  path = tmp_path / "odd_tools.py"
  path.write_text(TRL_TOOLS.replace("TOOLS = [add, shout, where, nap]", tools_line))
  with pytest.raises(errors.InputError, match=f"rl.tools_path={path}: {expected}"):
    tools.user_tools(str(path))


def test_train_rl_exits_2_before_the_model_loads_for_an_untyped_tool_function(tmp_path, capsys, monkeypatch):
  from maxtext.trainers.post_train.rl import train_rl, training_run

  def must_not_run(*args, **kwargs):
    raise AssertionError("the tools file is checked before the model loads")

  monkeypatch.setattr(training_run, "load_model", must_not_run)
  path = tmp_path / "my_tools.py"
  path.write_text('def lookup(key):\n  """Looks a key up.\n\n  Args:\n    key: the key\n  """\n\nTOOLS = [lookup]\n')
  args = ["model_name=qwen3-tiny", "rl.use_agentic_rollout=true", f"rl.tools_path={path}", "rl.tools=[lookup]"]
  assert train_rl.main(["train_rl", "rl.yml", f"base_output_directory={tmp_path}", *args]) == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
    f"error: rl.tools_path={path}:1: tool function lookup: Argument key is missing a type hint in function lookup "
    "(a tool function needs a type hint on every argument and a Google-style docstring: a description, then Args: "
    "with a line for each argument)"
  )


def test_the_calculator_agent_offers_the_calculator_tool_as_the_run_s_own_agent_does():
  """src/maxtext/agents/calculator.py's schema is the built-in tool's (its prompt is the same)."""
  from maxtext.agents import calculator

  assert tools.CalculatorTool("calculator", tools.CalculatorTool.__doc__).get_json_schema() == calculator.CALCULATOR
