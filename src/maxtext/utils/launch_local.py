"""Runs one command as N JAX processes on this machine, as a cluster runs it on N hosts.

    python -m maxtext.utils.launch_local --processes 2 [--devices-per-process 2] [--port P] -- \\
        python -m maxtext.trainers.post_train.rl.train_rl rl.yml [key=value ...]

Each process gets the variables a cluster sets (JAX_COORDINATOR_ADDRESS=127.0.0.1:P, JAX_NUM_PROCESSES,
JAX_PROCESS_ID) and nothing else new; --devices-per-process gives each that many host (CPU) devices.
Their output is forwarded line by line behind `[pK] `. When one process fails (a non-zero exit or a
signal), the others are ended (SIGTERM, then SIGKILL after --grace-s) and the launcher exits with the
first failure's code (128 + N for signal N); SIGINT or SIGTERM to the launcher is passed to every
process, so a preemption reaches all of them.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def environment(base: dict, process: int, processes: int, port: int, devices: int | None) -> dict:
  """The environment of process `process`: base plus what a cluster sets for it."""
  env = dict(
    base,
    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
    JAX_NUM_PROCESSES=str(processes),
    JAX_PROCESS_ID=str(process),
    PYTHONUNBUFFERED="1",
  )
  if devices:
    env["XLA_FLAGS"] = f"{base.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
  return env


def _forward(stream, prefix: str, lock: threading.Lock) -> None:
  for line in iter(stream.readline, b""):
    with lock:
      sys.stdout.buffer.write(prefix.encode() + line)
      sys.stdout.buffer.flush()


def _exit_code(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode


def launch(
  command: list[str], processes: int, devices: int | None = None, port: int | None = None, grace_s: float = 30.0
) -> int:
  """Runs command as `processes` processes; returns the launcher's exit code (see the module docstring)."""
  port = port or free_port()
  lock = threading.Lock()
  procs, forwarders = [], []
  for k in range(processes):
    proc = subprocess.Popen(
      command,
      env=environment(dict(os.environ), k, processes, port, devices),
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      start_new_session=True,
    )
    forwarders.append(threading.Thread(target=_forward, args=(proc.stdout, f"[p{k}] ", lock), daemon=True))
    forwarders[-1].start()
    procs.append(proc)

  def signal_all(signum):
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signum)

  forwarded = []

  def forward(signum, _frame):  # every process stops on its own; a second signal would abandon its step
    forwarded.append(signum)
    signal_all(signum)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  failure = None
  try:
    while any(p.poll() is None for p in procs):
      failed = [p for p in procs if p.poll() not in (None, 0)]
      if failed and failure is None and not forwarded:
        failure = failed[0]
        print(
          f"[launcher] process {procs.index(failure)} ended with exit code {_exit_code(failure.returncode)}; "
          "ending the others",
          file=sys.stderr,
          flush=True,
        )
        signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
          time.sleep(0.2)
        signal_all(signal.SIGKILL)
      time.sleep(0.2)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    signal_all(signal.SIGKILL)
    for p in procs:
      p.wait()
    for t in forwarders:  # the last lines of every process
      t.join(timeout=10)
  failure = failure or next((p for p in procs if p.returncode != 0), None)
  return _exit_code(failure.returncode) if failure else 0


def main(argv: list[str]) -> int:
  if "--" not in argv:
    print(
      "usage: python -m maxtext.utils.launch_local --processes N [--devices-per-process D] [--port P] -- COMMAND ...",
      file=sys.stderr,
    )
    return 2
  split = argv.index("--")
  parser = argparse.ArgumentParser(prog="python -m maxtext.utils.launch_local")
  parser.add_argument("--processes", type=int, required=True)
  parser.add_argument("--devices-per-process", type=int, default=None, help="host (CPU) devices per process")
  parser.add_argument("--port", type=int, default=None, help="the coordinator's port (default: a free one)")
  parser.add_argument("--grace-s", type=float, default=30.0, help="SIGTERM to SIGKILL when ending the others")
  opts = parser.parse_args(argv[:split])
  if opts.processes < 1 or not argv[split + 1 :]:
    parser.error("--processes must be at least 1 and a command must follow --")
  return launch(argv[split + 1 :], opts.processes, opts.devices_per_process, opts.port, opts.grace_s)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
