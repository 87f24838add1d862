"""An environment server the run starts (environment.command): a process of its own, in the interpreter or
venv the command names (an environment package whose pins clash with the trainer's runs there), serving
on loopback at a free port that replaces `{port}` in the command.

`start` waits until GET /health answers 200 (InputError naming the key, with the tail of the server's
output, where the process exits first or it does not answer within `wait_s`). The server runs in a
session of its own and is killed with everything it started (its process group) by `close`, when the
trainer's interpreter exits, and, through PR_SET_PDEATHSIG, when the trainer dies by SIGKILL.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from maxtext.utils import errors
from maxtext.utils.bridges import bridge_common

KEY = "environment.command"
# Linux: the server's process is killed with SIGKILL when the trainer dies (prctl's PR_SET_PDEATHSIG,
# set in the child before it execs the command, and kept across exec).
_EXEC = (
  "import ctypes, os, signal, sys\n"
  "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
  "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Child:
  """A process of the run's (an environment server, the verifiers bridge): `argv` run through _EXEC (so
  it dies with the trainer), in a session of its own, its output kept in a temporary file; `key` names
  the setting that made it, for refusals."""

  def __init__(self, argv: list[str], key: str, env: dict[str, str] | None = None):
    self.key = key
    self._log = tempfile.TemporaryFile()
    try:
      self.process = subprocess.Popen(
        [sys.executable, "-c", _EXEC, *argv],
        stdin=subprocess.DEVNULL,
        stdout=self._log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
      )
    except OSError as e:
      self._log.close()
      raise errors.InputError(f"{key}={shlex.join(argv)}: {e}") from None
    atexit.register(self.close)

  def output(self, chars: int = 2000) -> str:
    """The end of what the process wrote to stdout and stderr."""
    if self._log.closed:
      return ""
    self._log.seek(0)
    return self._log.read().decode(errors="replace")[-chars:]

  def close(self) -> None:
    """Kills the process and what it started (SIGTERM, SIGKILL after 5 s); its output is gone."""
    if self.process.poll() is None:
      try:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=5)
      except subprocess.TimeoutExpired:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
      except ProcessLookupError:
        pass
    self._log.close()
    atexit.unregister(self.close)


class EnvServer:
  """A started environment server (see the module docstring); `url` is http://127.0.0.1:PORT."""

  def __init__(self, command: str, wait_s: float):
    port = free_port()
    argv = shlex.split(command.replace("{port}", str(port)))
    if not argv:
      raise errors.InputError(f"{KEY} is empty")
    self.url = f"http://127.0.0.1:{port}"
    self._child = Child(argv, KEY)
    self._wait(command, wait_s)

  def _wait(self, command: str, wait_s: float) -> None:
    import httpx

    deadline = time.monotonic() + wait_s
    process = self._child.process
    while True:
      if process.poll() is not None:
        output = self.output()
        self.close()
        raise errors.InputError(
          f"{KEY}={command}: exited with {process.returncode} before serving; its output ends:\n{output}"
        )
      try:
        if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
          return
      except httpx.HTTPError:
        pass
      if time.monotonic() > deadline:
        output = self.output()
        self.close()
        raise errors.InputError(
          f"{KEY}={command}: GET {self.url}/health did not answer 200 within {wait_s:g} s (rl.agent_wait_s); "
          f"its output ends:\n{output}"
        )
      time.sleep(0.2)

  def output(self, chars: int = 2000) -> str:
    """The end of what the server wrote to stdout and stderr."""
    return self._child.output(chars)

  def close(self) -> None:
    """Kills the server and what it started (SIGTERM, SIGKILL after 5 s); its output is gone."""
    self._child.close()


def run_bridge(argv: list[str], where: str, what: str, wait_s: float) -> str:
  """Runs a bridge script to its end in the environment's interpreter (argv[0], which environment.python
  named) within `wait_s` (rl.agent_wait_s), killed with the trainer as a Child is: its last line of
  output. An InputError starting with `where` (the agent's key) otherwise: the bridge's own one line where
  it refused (bridge_common.REFUSED), the tail of its output where it broke, or that `what` (the environment's key and
  value) did not load in time."""
  if shutil.which(argv[0]) is None:
    raise errors.InputError(f"{where}: environment.python={argv[0]}: no such interpreter")
  try:  # through _EXEC: it dies with the trainer, even by SIGKILL
    done = subprocess.run(
      [sys.executable, "-c", _EXEC, *argv], capture_output=True, text=True, timeout=wait_s, stdin=subprocess.DEVNULL
    )
  except subprocess.TimeoutExpired:
    raise errors.InputError(f"{where}: {what} did not load within {wait_s:g} s (rl.agent_wait_s)") from None
  lines = done.stderr.strip().splitlines()
  if done.returncode == bridge_common.REFUSED and lines:  # the bridge's own refusal, its last line
    raise errors.InputError(f"{where}: {lines[-1]}")
  if done.returncode != 0:
    raise errors.InputError(
      f"{where}: environment.python={argv[0]} could not run the bridge (exit {done.returncode}); its output ends:\n"
      + "\n".join(lines[-20:])
    )
  return done.stdout.strip().splitlines()[-1]


def bridge(argv: list[str], api_key: str | None) -> Child:
  """A bridge script's episodes mode (argv[0] the environment's interpreter) as a process of the run's,
  given the run's API key, where it has one, in its environment (not in its argv, which ps shows)."""
  env = dict(os.environ)
  env.pop(bridge_common.KEY_ENV, None)
  if api_key:
    env[bridge_common.KEY_ENV] = api_key
  return Child(argv, "environment.python", env)
