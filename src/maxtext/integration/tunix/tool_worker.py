"""Worker processes that run tool calls, so that a call past its time limit can be killed.

A tool call that hangs in the trainer's process cannot be stopped: Python cannot kill a thread, and
one left running keeps a core busy (and holds the GIL) for the rest of the run. ToolWorkers runs
each call in a worker process instead and kills that process (SIGKILL) when the call has no result
within its time limit.

- A worker is a fresh interpreter (started with subprocess, not forked from the multi-threaded
  trainer) that gets the trainer's sys.path, runs the pool's `load` (a picklable callable, such as a
  functools.partial of a module-level function) to get its tools by name, instantiates each as
  Tunix's ToolManager does (its name, its class docstring as description), then answers one call at
  a time over a socket: the tool's output as text (as the tool turn writes it) and its error.
- `import tunix...` in a worker skips tunix/__init__.py, which imports Tunix's trainers and with
  them JAX (slow to start and large in memory, in every worker); the tool classes need only
  tunix.rl.agentic.tools, whose packages have no __init__ code.
- A call takes an idle worker or starts a new one, so concurrent calls never wait for each other;
  a worker whose call timed out, crashed or exited is gone, and later calls start new ones. Starting
  a worker is not counted in a call's time limit; one not started within START_S is killed and the
  call comes back as an error.
- Workers are killed when the pool is garbage-collected and when the trainer's interpreter exits
  (a busy one's call then comes back as an error); a worker whose trainer died, even by SIGKILL,
  exits on its own. Workers ignore SIGINT (Ctrl-C reaches the trainer, which kills them).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from multiprocessing import connection
from pathlib import Path
from typing import Any

import maxtext

START_S = 60.0

_SERVE = "from maxtext.integration.tunix import tool_worker; tool_worker.serve({fd})"


class _Worker:
  """A worker process and the trainer's end of its socket."""

  def __init__(self, load: Callable[[], dict[str, type]]):
    ours, theirs = socket.socketpair()
    with theirs:
      env = dict(os.environ)
      env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(maxtext.__file__).parents[1]), env.get("PYTHONPATH")) if p
      )
      self.process = subprocess.Popen(
        [sys.executable, "-c", _SERVE.format(fd=theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
        env=env,
      )
    self.conn = connection.Connection(ours.detach())
    self.conn.send(sys.path)
    self.conn.send(load)

  def stop(self) -> str:
    """Kills the process (if it still runs), reaps it and closes the socket; how the process ended."""
    self.process.kill()
    code = self.process.wait()
    self.conn.close()
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _stop_all(lock: threading.Lock, running: set[_Worker], idle: list[_Worker]) -> None:
  with lock:
    workers = list(running)
    running.clear()
    idle.clear()
  for worker in workers:
    worker.stop()


class ToolWorkers:
  """Worker processes running the tools that `load` returns; each call bounded by timeout_s seconds."""

  def __init__(self, load: Callable[[], dict[str, type]], timeout_s: float):
    self._load = load
    self._timeout_s = timeout_s
    self._lock = threading.Lock()
    self._idle: list[_Worker] = []
    self._running: set[_Worker] = set()
    weakref.finalize(self, _stop_all, self._lock, self._running, self._idle)

  def call(self, name: str, kwargs: dict[str, Any]) -> tuple[str | None, str | None]:
    """(output text or None, error text or None) of tool `name` applied to kwargs in a worker. A
    tool's exception, a timeout and a worker that crashes or exits come back as the error text; a
    kwargs that cannot be pickled raises."""
    message = pickle.dumps((name, kwargs))
    with self._lock:
      worker = self._idle.pop() if self._idle else None
    if worker is None:
      worker, error = self._start()
      if worker is None:
        return None, error
    try:
      worker.conn.send_bytes(message)
      if not worker.conn.poll(self._timeout_s):
        self._stop(worker)
        return None, f"no result within rl.tool_timeout_s={self._timeout_s:g} s"
      result = worker.conn.recv()
    except (EOFError, OSError):
      return None, f"the tool's worker process ended without a result ({self._stop(worker)})"
    with self._lock:
      self._idle.append(worker)
    return result

  def _start(self) -> tuple[_Worker | None, str]:
    worker = _Worker(self._load)
    with self._lock:
      self._running.add(worker)
    if not worker.conn.poll(START_S):
      return None, f"the tool's worker process did not start within {START_S:g} s ({self._stop(worker)})"
    try:
      failure = worker.conn.recv()
    except (EOFError, OSError):
      return None, f"the tool's worker process ended while starting ({self._stop(worker)})"
    if failure is not None:
      self._stop(worker)
      return None, f"the tool's worker process could not load the tools: {failure}"
    return worker, ""

  def _stop(self, worker: _Worker) -> str:
    with self._lock:
      self._running.discard(worker)
    return worker.stop()


def _exit_with_trainer(fd: int) -> None:
  """Ends the worker when the trainer's end of the socket closes, even while a call runs."""
  poller = select.poll()
  poller.register(fd, select.POLLRDHUP)
  poller.poll()
  os._exit(0)


def serve(fd: int) -> None:
  """The worker's loop over the socket `fd` (ToolWorkers starts it with `python -c`)."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  threading.Thread(target=_exit_with_trainer, args=(fd,), daemon=True).start()
  conn = connection.Connection(fd)
  sys.path[:] = conn.recv()
  spec = importlib.util.find_spec("tunix")
  if spec is not None:  # its subpackages without its package __init__ (see the module docstring)
    sys.modules["tunix"] = importlib.util.module_from_spec(spec)
  from tunix.rl.agentic.tools import base_tool

  try:
    tools = {name: cls(name=name, description=cls.__doc__ or "") for name, cls in conn.recv()().items()}
  except Exception as e:
    conn.send(f"{type(e).__name__}: {e}")
    return
  conn.send(None)
  while True:
    try:
      name, kwargs = conn.recv()
    except EOFError:
      return
    try:
      out = tools[name].apply(**kwargs)
      if isinstance(out, base_tool.ToolOutput):
        result = (
          str(base_tool.ToolOutput(name=name, output=out.output)) or None,
          str(out.error) if out.error else None,
        )
      else:
        result = (str(out), None)
    except Exception as e:
      result = (None, f"{type(e).__name__}: {e}")
    conn.send(result)
