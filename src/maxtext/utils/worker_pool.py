"""User code (reward functions, tools, a dataset processor) run in worker processes that can be
killed, so that no call of it can hang the trainer, end it or keep it from exiting.

User code run in the trainer's process could do all three: Python cannot stop a thread, so a call
that never returns hangs the run for good; sys.exit or os._exit ends it, with exit code 0 if the
code says so; a non-daemon thread it starts keeps the interpreter from exiting after the run is
done. A WorkerPool runs each call in a worker process instead:

- A worker is a fresh interpreter (started with subprocess, not forked from the multi-threaded
  trainer), or, for a pool given `preload` (modules slow to import, such as `openai`), a process
  forked from multiprocessing's fork server (a single-threaded interpreter that imported them once:
  a worker then starts in milliseconds instead of seconds); either gets the trainer's sys.path,
  unpickles and runs the pool's `load` (a picklable callable, such as a functools.partial of a
  module-level function) to get its handler, then answers one call at a time over a socket with
  handler(*args), which must be picklable both ways. The
  packages named in `bare` are imported there without their __init__ code (Tunix's imports its
  trainers and with them JAX, slow to start and large in memory in every worker, while tools need
  only subpackages whose __init__ files are empty).
- A call comes back as its handler's result, as CallRaised where the handler raised, and as
  CallFailed (one line saying why) where it gave no result: past the pool's time limit (its worker
  is killed with SIGKILL, with every thread the call started), sys.exit in the handler, a worker that
  exits or crashes, or one that did not start within START_S (not counted in a call's time limit)
  or whose `load` raised. A worker that failed is gone; later calls start new ones.
- A call takes an idle worker or starts a new one, so concurrent calls never wait for each other.
- Workers are killed when the pool is closed or garbage-collected and when the trainer's interpreter exits
  (threads a call left running die with them); a worker whose trainer died, even by SIGKILL, exits on
  its own. Workers ignore SIGINT (Ctrl-C reaches the trainer, which kills them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import multiprocessing.process
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
import types
import weakref
from collections.abc import Callable
from multiprocessing import connection
from pathlib import Path
from typing import Any

import maxtext

START_S = 60.0
_POOLS: weakref.WeakSet = weakref.WeakSet()  # every live pool (stop_all)

_SERVE = "from maxtext.utils import worker_pool; worker_pool.serve({fd})"


class CallFailed(Exception):
  """A call that gave no result; its message says why, on one line."""


class CallRaised(Exception):
  """The handler raised: `type_name` and `message` (on one line) of its exception, `trace` its
  traceback's text."""

  def __init__(self, type_name: str, message: str, trace: str):
    super().__init__(f"{type_name}: {message}")
    self.type_name, self.message, self.trace = type_name, message, trace
    if trace:
      self.add_note(f"In the worker process:\n{trace}")


class _Worker:
  """A worker process and the trainer's end of its socket: a fresh interpreter, or with `preload` a
  process forked from multiprocessing's fork server."""

  def __init__(self, load: Callable[[], Callable], bare: tuple[str, ...], preload: tuple[str, ...] = ()):
    self._stopping = threading.Lock()
    self._ended: str | None = None
    if preload:
      context = multiprocessing.get_context("forkserver")
      context.set_forkserver_preload(list(preload))  # takes effect where the fork server starts
      self.conn, child = context.Pipe()
      self.process: subprocess.Popen | multiprocessing.process.BaseProcess = context.Process(
        target=serve_connection, args=(child,), daemon=True
      )
      with _without_main():
        self.process.start()
      child.close()
    else:
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
    self.conn.send((sys.path, bare))
    self.conn.send(load)

  def stop(self) -> str:
    """Kills the process (if it still runs), reaps it and closes the socket, once (a call's thread
    and the pool's close may both stop it); how the process ended."""
    with self._stopping:
      if self._ended is None:
        self.process.kill()
        if isinstance(self.process, subprocess.Popen):
          code = self.process.wait()
        else:
          self.process.join()
          code = int(self.process.exitcode or 0)
        self.conn.close()
        self._ended = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
      return self._ended


_LAUNCHING = threading.Lock()


@contextlib.contextmanager
def _without_main():
  """A bare module as __main__ while a fork server's worker is launched: multiprocessing has each
  worker import the launching program's __main__ module (train_rl's: JAX and Tunix, some 170 MB of
  memory and seconds of start-up per worker, for code no worker runs) unless __main__ names none."""
  with _LAUNCHING:
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
      yield
    finally:
      sys.modules["__main__"] = main


def _stop_all(lock: threading.Lock, running: set[_Worker], idle: list[_Worker]) -> None:
  with lock:
    workers = list(running)
    running.clear()
    idle.clear()
  for worker in workers:
    worker.stop()


def stop_all() -> None:
  """Kills the workers of every pool now (a run abandoned by a second signal: the user code they run
  cannot hold the process, and a call in flight fails with CallFailed)."""
  for pool in list(_POOLS):
    pool.close()


class WorkerPool:
  """Worker processes running the handler that `load` returns; each call bounded by timeout_s
  seconds, which `limit` names in its error (e.g. "rl.tool_timeout_s=5"); `bare`: packages the
  workers import without their __init__ code."""

  def __init__(
    self,
    load: Callable[[], Callable],
    timeout_s: float,
    limit: str,
    bare: tuple[str, ...] = (),
    preload: tuple[str, ...] = (),
  ):
    self._load, self._bare, self._preload = load, bare, preload
    self._timeout_s = timeout_s
    self._limit = limit
    self._lock = threading.Lock()
    self._idle: list[_Worker] = []
    self._running: set[_Worker] = set()
    self._finalizer = weakref.finalize(self, _stop_all, self._lock, self._running, self._idle)
    _POOLS.add(self)

  def close(self) -> None:
    """Kills every worker now (as garbage collection would); a call in flight fails with CallFailed."""
    self._finalizer()

  def call(self, *args: Any) -> Any:
    """handler(*args) in a worker: its result; CallRaised or CallFailed (see the module docstring).
    Arguments that cannot be pickled raise here."""
    message = pickle.dumps(args)
    with self._lock:
      worker = self._idle.pop() if self._idle else None
    if worker is None:
      worker = self._start()
    try:
      worker.conn.send_bytes(message)
      if not worker.conn.poll(self._timeout_s):
        self._stop(worker)
        raise CallFailed(f"no result within {self._limit} s")
      kind, *value = worker.conn.recv()
    except (EOFError, OSError):
      raise CallFailed(f"its worker process ended without a result ({self._stop(worker)})") from None
    if kind == "exit":
      self._stop(worker)
      raise CallFailed(f"called sys.exit({value[0]!r})")
    with self._lock:
      self._idle.append(worker)
    if kind == "raised":
      raise CallRaised(*value)
    return value[0]

  def warm(self) -> int:
    """Starts a worker (its code loaded), which stands idle for the next call; its process id."""
    worker = self._start()
    with self._lock:
      self._idle.append(worker)
    assert worker.process.pid is not None, "a started worker has a process id"
    return worker.process.pid

  def _start(self) -> _Worker:
    worker = _Worker(self._load, self._bare, self._preload)
    with self._lock:
      self._running.add(worker)
    if not worker.conn.poll(START_S):
      raise CallFailed(f"its worker process did not start within {START_S:g} s ({self._stop(worker)})")
    try:
      failure = worker.conn.recv()
    except (EOFError, OSError):
      raise CallFailed(f"its worker process ended while starting ({self._stop(worker)})") from None
    if failure is not None:
      self._stop(worker)
      raise CallFailed(f"its worker process could not load the code: {failure}")
    return worker

  def _stop(self, worker: _Worker) -> str:
    with self._lock:
      self._running.discard(worker)
    return worker.stop()


def resident_bytes(pid: int) -> float:
  """Process `pid`'s resident memory now (Linux's VmRSS; 0 where there is no /proc)."""
  try:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
      return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024
  except OSError:
    return 0.0


def one_line(e: BaseException) -> str:
  """The exception's message on one line."""
  return " ".join(str(e).split())


def _exit_with_trainer(fd: int) -> None:
  """Ends the worker when the trainer's end of the socket closes, even while a call runs."""
  poller = select.poll()
  poller.register(fd, select.POLLRDHUP)
  poller.poll()
  os._exit(0)


def _answer(handler: Callable, args: tuple) -> tuple[str, bytes]:
  """The reply to one call, pickled, and its kind: ("ok", result), ("raised", type name, message,
  traceback) or ("exit", code)."""
  try:
    reply: tuple = ("ok", handler(*args))
  except SystemExit as e:
    reply = ("exit", e.code if isinstance(e.code, (int, str, type(None))) else repr(e.code))
  except Exception as e:
    reply = ("raised", type(e).__name__, one_line(e), traceback.format_exc())
  try:
    return reply[0], pickle.dumps(reply)
  except Exception as e:  # a result that cannot be pickled
    return "raised", pickle.dumps(("raised", type(e).__name__, f"its result cannot be sent back: {one_line(e)}", ""))


def serve(fd: int) -> None:
  """The worker's loop over the socket `fd` (WorkerPool starts it with `python -c`)."""
  serve_connection(connection.Connection(fd))


def serve_connection(conn: connection.Connection) -> None:
  """The worker's loop over `conn` (a fork server's worker starts here). It ends with os._exit, so
  that no thread the calls started keeps it alive."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  threading.Thread(target=_exit_with_trainer, args=(conn.fileno(),), daemon=True).start()
  sys.path[:], bare = conn.recv()
  for name in bare:
    spec = importlib.util.find_spec(name)
    if spec is not None:
      sys.modules[name] = importlib.util.module_from_spec(spec)
  try:
    handler = conn.recv()()
  except BaseException as e:  # noqa: BLE001 (a load that calls sys.exit fails too)
    conn.send(f"{type(e).__name__}: {one_line(e)}")
    os._exit(0)
  conn.send(None)
  while True:
    try:
      args = conn.recv()
    except EOFError:
      os._exit(0)
    kind, reply = _answer(handler, args)
    conn.send_bytes(reply)
    if kind == "exit":
      os._exit(0)
