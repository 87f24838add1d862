"""WorkerPool's two kinds of worker, a fresh interpreter and a process forked from a fork server that
preloaded modules: each gives a call's result, its exception, and stops a call that hangs or exits,
killing its process; a forked worker starts with the preloaded modules imported."""

import functools
import os
import subprocess
import sys
import time

import pytest

from maxtext.utils import worker_pool

KINDS = {"fresh interpreter": (), "forked, openai preloaded": ("openai",)}


def _handler():
  """A worker's handler (WorkerPool's `load`): what each call asks of it."""

  def handle(what: str, arg=None):
    if what == "pid":
      return os.getpid()
    if what == "raise":
      raise ValueError(f"bad {arg}")
    if what == "hang":
      time.sleep(3600)
    if what == "exit":
      raise SystemExit(3)
    if what == "preloaded":  # before the handler imported it
      return "openai" in sys.modules
    return arg

  return handle


@pytest.mark.parametrize("preload", KINDS.values(), ids=KINDS.keys())
def test_results_errors_hangs_and_exits(preload):
  pool = worker_pool.WorkerPool(functools.partial(_handler), 2.0, "a_limit=2", preload=preload)
  try:
    pid = pool.call("pid")
    assert pid != os.getpid() and pool.call("echo", {"a": [1]}) == {"a": [1]}
    with pytest.raises(worker_pool.CallRaised, match="ValueError: bad thing"):
      pool.call("raise", "thing")
    assert pool.call("pid") == pid  # a worker whose handler raised serves on
    with pytest.raises(worker_pool.CallFailed, match="no result within a_limit=2 s"):
      pool.call("hang")
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)  # the hung worker was killed
    with pytest.raises(worker_pool.CallFailed, match=r"called sys.exit\(3\)"):
      pool.call("exit")
    assert pool.call("echo", 5) == 5  # later calls get new workers
  finally:
    pool.close()


@pytest.mark.parametrize("preload, already", [((), False), (("openai",), True)], ids=KINDS.keys())
def test_a_forked_worker_has_what_was_preloaded_without_importing_it(preload, already):
  pool = worker_pool.WorkerPool(functools.partial(_handler), 60.0, "a limit", preload=preload)
  try:
    assert pool.call("preloaded") is already
  finally:
    pool.close()


_TRAINER = """
import functools, sys
from maxtext.utils import worker_pool
from tests.unit.test_worker_pool import _handler
pool = worker_pool.WorkerPool(functools.partial(_handler), 600.0, "a limit", preload=tuple(sys.argv[1:]))
print(pool.call("pid"), flush=True)
pool.call("hang")
"""


@pytest.mark.parametrize("preload", KINDS.values(), ids=KINDS.keys())
def test_a_worker_whose_trainer_is_killed_exits(preload):
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  trainer = subprocess.Popen([sys.executable, "-c", _TRAINER, *preload], stdout=subprocess.PIPE, text=True, cwd=root)
  try:
    pid = int(trainer.stdout.readline())
    os.kill(pid, 0)  # the worker runs (its call hangs)
    trainer.kill()
    trainer.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
      time.sleep(0.1)
    assert not _alive(pid)
  finally:
    trainer.kill()


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
    return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited


MAIN = """
import functools, os, sys
open(os.path.join({marks!r}, f"imported-{{os.getpid()}}"), "w").close()  # what importing this program does
if __name__ == "__main__":
  sys.path.insert(0, {root!r})
  from maxtext.utils import worker_pool
  pool = worker_pool.WorkerPool(functools.partial(functools.partial, os.getpid), 30, "x", preload=("json",))
  pid = pool.warm()
  print(pool.call(), pid, worker_pool.resident_bytes(pid) > 0)
"""


def test_a_forked_worker_does_not_import_the_launching_program(tmp_path):
  """A fork server's worker runs only the pool's code: multiprocessing would have it import the
  program that launched it (train_rl's __main__: JAX and Tunix, some 170 MB a worker)."""
  marks = tmp_path / "marks"
  marks.mkdir()
  root = os.path.dirname(os.path.dirname(worker_pool.__file__))
  program = tmp_path / "program.py"
  program.write_text(MAIN.format(marks=str(marks), root=os.path.dirname(root)))
  out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=120, check=True)
  worker, warmed, measured = out.stdout.split()
  assert worker == warmed and measured == "True"  # the warmed worker took the call; its memory is read
  names = [p.name for p in marks.iterdir()]
  assert len(names) == 1 and names != [f"imported-{worker}"]  # the program's own import only, no worker's
