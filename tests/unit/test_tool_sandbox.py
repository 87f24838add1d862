"""Attacks on the python tool, as model-written code would try them: each succeeds with the sandbox off
(rl.tool_sandbox=none: the code runs as the trainer's user, in a temporary folder) and is blocked with it
on (bubblewrap and seccomp). The targets are real: a secret file, a folder and a process outside the
call, a TCP listener on the host's loopback, the interpreter's own site-packages."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from maxtext.configs import pyconfig
from maxtext.integration.tunix import tools
from maxtext.utils import errors, sandbox
from tests.conftest import make_config

TOKEN = uuid.uuid4().hex


def call(code: str, sandboxed: bool, timeout_s: float = 10) -> tuple[str, str | None]:
  return sandbox.run(code, sandboxed, timeout_s, int(timeout_s) + 1, 256, 4000)


@pytest.fixture(scope="module")
def listener():
  """(port, hits): a TCP server on the host's loopback; hits[0] counts connections it accepted."""
  server = socket.create_server(("127.0.0.1", 0))
  hits = [0]

  def accept():
    while True:
      try:
        conn, _ = server.accept()
      except OSError:
        return
      hits[0] += 1
      conn.close()

  threading.Thread(target=accept, daemon=True).start()
  yield server.getsockname()[1], hits
  server.close()


@pytest.fixture
def victim(tmp_path):
  """A process of the trainer's user holding a secret in its environment, its stdout a file (.out)."""
  out = tmp_path / "victim_stdout.txt"
  with open(out, "wb") as f:
    proc = subprocess.Popen(["sleep", "60"], env={"PATH": os.defpath, "SECRET": TOKEN}, stdout=f)
  proc.out = out
  yield proc
  proc.kill()
  proc.wait()


def _connect(port):
  return f"import socket\ns = socket.socket()\ns.settimeout(3)\ns.connect(('127.0.0.1', {port}))\nprint('connected')"


NETWORK_ROUTES = {
  "socket module": _connect,
  "_socket": lambda port: f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('connected')",
  "reloaded socket": lambda port: "import importlib, socket\nimportlib.reload(socket)\n" + _connect(port),
  "ctypes": lambda port: (
    "import ctypes, socket, struct\nlibc = ctypes.CDLL(None)\nfd = libc.socket(2, 1, 0)\n"
    f"addr = struct.pack('=HH4s8x', 2, socket.htons({port}), socket.inet_aton('127.0.0.1'))\n"
    "assert libc.connect(fd, addr, len(addr)) == 0, ctypes.get_errno()\nprint('connected')"
  ),
  "python subprocess": lambda port: (
    f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {_connect(port)!r}], check=True)"
  ),
  "bash /dev/tcp": lambda port: (
    f"import subprocess\nsubprocess.run(['bash', '-c', 'echo hi > /dev/tcp/127.0.0.1/{port}'], check=True)\n"
    "print('connected')"
  ),
}


@pytest.mark.parametrize("route", NETWORK_ROUTES)
@pytest.mark.parametrize("sandboxed", [False, True], ids=["off", "on"])
def test_network_by_every_route(listener, route, sandboxed):
  if route == "bash /dev/tcp" and not shutil.which("bash"):
    pytest.skip("no bash")
  port, hits = listener
  before = hits[0]
  output, error = call(NETWORK_ROUTES[route](port), sandboxed)
  time.sleep(0.2)
  reached = hits[0] > before
  assert reached == (not sandboxed), (output, error)


@pytest.mark.parametrize("sandboxed", [False, True], ids=["off", "on"])
def test_files_outside_the_call(tmp_path, sandboxed):
  """Read a secret file, /etc and a file in the home folder; write and delete files outside the call's folder."""
  secret = tmp_path / "secret.txt"
  secret.write_text(TOKEN)
  doomed = tmp_path / "doomed.txt"
  doomed.write_text("x")
  in_home = os.path.join(os.path.expanduser("~"), f".sandbox_probe_{TOKEN}")
  attempts = [
    f"import os\nprint(open({str(secret)!r}).read())",
    "print(open('/etc/passwd').read()[:4])",
    f"print(open({in_home!r}).read())",
    f"open({str(tmp_path / 'planted.txt')!r}, 'w').write('x')\nprint('written')",
    f"import os\nos.remove({str(doomed)!r})\nprint('removed')",
  ]
  with open(in_home, "w", encoding="utf-8") as f:
    f.write(TOKEN)
  try:
    results = [call(c, sandboxed) for c in attempts]
  finally:
    os.remove(in_home)
  if not sandboxed:
    assert TOKEN in results[0][0] and results[1][0].startswith("root")
    assert TOKEN in results[2][0] and (tmp_path / "planted.txt").exists() and not doomed.exists()
  else:
    assert all(error and not output for output, error in results), results
    assert not (tmp_path / "planted.txt").exists() and doomed.exists()


@pytest.mark.parametrize("sandboxed", [False, True], ids=["off", "on"])
def test_interpreter_and_project_are_read_only(sandboxed):
  """A file planted in site-packages (a .pth there runs in every later interpreter) or the project."""
  site = next(p for p in sys.path if p.endswith("site-packages"))
  project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for folder in (site, project):
    target = os.path.join(folder, f"_sandbox_probe_{TOKEN}.txt")
    output, error = call(
      f"import os\nopen({target!r}, 'w').write('x')\nos.remove({target!r})\nprint('written')", sandboxed
    )
    assert (output == "written\n") == (not sandboxed), (folder, output, error)
    assert not os.path.exists(target)


@pytest.mark.parametrize("sandboxed", [False, True], ids=["off", "on"])
def test_another_call_s_folder(sandboxed):
  """A concurrent call's working folder, found under the host's temporary folder."""
  slow = threading.Thread(target=call, args=("import time\nopen('mine.txt', 'w').write('x')\ntime.sleep(3)", sandboxed))
  slow.start()
  time.sleep(1.0)
  output, error = call(
    f"import glob, os\nprint([d for d in glob.glob({tempfile.gettempdir()!r} + '/tool_python_*/mine.txt')])", sandboxed
  )
  slow.join()
  assert (output not in ("[]\n", "")) == (not sandboxed), (output, error)


@pytest.mark.parametrize("sandboxed", [False, True], ids=["off", "on"])
def test_other_processes_environment_memory_and_signals(victim, sandboxed):
  """Another process of the trainer's user (the trainer itself is one): its environment through
  /proc, its memory through /proc/<pid>/mem, its stdout through /proc/<pid>/fd/1, and a signal."""
  pid = victim.pid
  call(f"open('/proc/{pid}/fd/1', 'w').write('written by the tool')", sandboxed)
  environ, _ = call(f"print(open('/proc/{pid}/environ', 'rb').read())", sandboxed)
  memory, _ = call(
    f"maps = open('/proc/{pid}/maps').readline().split()[0].split('-')\n"
    f"f = open('/proc/{pid}/mem', 'rb')\nf.seek(int(maps[0], 16))\nprint(len(f.read(64)))",
    sandboxed,
  )
  call(f"import os, signal\nos.kill({pid}, signal.SIGTERM)", sandboxed)
  time.sleep(0.3)
  alive = victim.poll() is None
  wrote = "written by the tool" in victim.out.read_text()
  if not sandboxed:
    assert TOKEN in environ and memory == "64\n" and wrote and not alive
  else:
    assert TOKEN not in environ and memory == "" and not wrote and alive


@pytest.mark.parametrize("sandboxed", [False, True], ids=["off", "on"])
def test_processes_forks_and_survivors(tmp_path, sandboxed):
  """Forking, a setsid grandchild that outlives the call, and memory spread over children (the
  address-space limit is per process)."""
  forked, _ = call(
    "import os\npid = os.fork()\nif pid == 0: os._exit(0)\nos.waitpid(pid, 0)\nprint('forked')", sandboxed
  )
  marker = tmp_path / "survivor.txt"
  call(
    f"import os, time\nif os.fork() == 0:\n  os.setsid()\n  time.sleep(1.5)\n  open({str(marker)!r}, 'w').write('x')\n"
    "  os._exit(0)\nprint('parent returns')",
    sandboxed,
  )
  spread, _ = call(
    "import os\nkids = []\nfor _ in range(4):\n  pid = os.fork()\n  if pid == 0:\n    b = bytearray(150 << 20)\n"
    "    os._exit(0)\n  kids.append(pid)\nprint(sum(os.waitpid(k, 0)[1] == 0 for k in kids) * 150)",
    sandboxed,
  )
  time.sleep(2.5)
  if not sandboxed:
    assert forked == "forked\n" and marker.exists() and spread == "600\n"
  else:
    assert forked == "" and not marker.exists() and spread == ""


@pytest.mark.parametrize("sandboxed", [False, True], ids=["off", "on"])
def test_disk_is_capped(sandboxed):
  output, error = call(
    "for i in range(24):\n  open(f'f{i}', 'wb').write(b'0' * ((1 << 20) - 1))\nprint('24 MB')", sandboxed
  )
  assert (output == "24 MB\n") == (not sandboxed), (output, error)
  if sandboxed:
    assert "No space left on device" in error


def test_the_sandbox_sees_only_its_own_world():
  output, error = call(
    "import os\nstatus = dict(map(str.strip, l.split(':', 1)) for l in open('/proc/self/status'))\n"
    "print(repr((sorted(os.listdir('/proc/self/fd')), os.getpid(), "
    "os.path.realpath('/proc/self/fd/0'), sorted(os.listdir('/')), os.listdir('.'), "
    "status['NoNewPrivs'], status['CapEff'], status['Seccomp'], "
    "[l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]])))",
    sandboxed=True,
  )
  assert error is None, error
  fds, pid, stdin, root, cwd, no_new_privs, capabilities, seccomp, interfaces = eval(output)
  assert no_new_privs == "1" and int(capabilities, 16) == 0 and seccomp == "2"  # 2: a seccomp filter
  assert interfaces == ["lo"]
  assert fds == ["0", "1", "2", "3"]  # stdin, stdout, stderr and the listing itself
  assert pid == 2 and stdin == "/dev/null" and cwd == []
  assert not {"etc", "home", "bin"} & set(root)


@pytest.mark.parametrize("sandboxed", [False, True], ids=["off", "on"])
def test_output_floods_and_bad_bytes_become_error_texts(sandboxed):
  start = time.monotonic()
  output, error = call("import sys\nwhile True: sys.stdout.write('x' * 65536)", sandboxed, timeout_s=20)
  assert time.monotonic() - start < 10 and output == "" and "output over 1048576 bytes: killed" in error
  assert len(error) < 4200  # head and tail of tool_output_max_chars
  output, error = call("import sys\nsys.stdout.buffer.write(bytes(range(128, 256)))\nprint()", sandboxed)
  assert error is None and "\ufffd" in output
  start = time.monotonic()
  output, error = call("import time\ntime.sleep(100)", sandboxed, timeout_s=2)
  assert time.monotonic() - start < 5 and error.startswith("timed out after 2 s")


def test_python_tool_fails_closed_where_the_sandbox_cannot_start(monkeypatch, caplog):
  cfg = make_config("rl.use_agentic_rollout=true", "rl.tools=[python]")
  monkeypatch.setattr(sandbox, "_bwrap", lambda: "/nonexistent/bwrap")
  sandbox.check.cache_clear()
  try:
    with pytest.raises(errors.InputError, match="rl.tool_sandbox=none"):
      tools.tool_map(cfg.tools)
  finally:
    sandbox.check.cache_clear()
  none = make_config("rl.use_agentic_rollout=true", "rl.tools=[python]", "rl.tool_sandbox=none")
  with caplog.at_level("WARNING"):
    python = tools.tool_map(none.tools)["python"]("python", "run python")
  assert "UNSANDBOXED" in caplog.text
  assert python.apply(code="print(open('/etc/passwd').read()[:4])").output == "root\n"


def test_tool_sandbox_is_refused_without_the_python_tool():
  with pytest.raises(pyconfig.ConfigError, match="rl.tool_sandbox"):
    make_config("rl.use_agentic_rollout=true", "rl.tools=[calculator]", "rl.tool_sandbox=none")
  with pytest.raises(pyconfig.ConfigError, match="rl.tool_sandbox='docker'"):
    make_config("rl.use_agentic_rollout=true", "rl.tools=[python]", "rl.tool_sandbox=docker")


def test_python_tool_from_a_venv_under_tmp():
  """A virtual environment in a folder under /tmp (a clone's .venv there is ordinary) runs the python
  tool sandboxed: the interpreter is visible read-only, the working folder is empty, and nothing else
  of the host's /tmp (a file beside the venv, another folder) is visible."""
  with tempfile.TemporaryDirectory(dir="/tmp", prefix="venv_probe_") as folder:
    venv = os.path.join(folder, "venv")
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", venv], check=True)
    site = subprocess.run(
      [os.path.join(venv, "bin", "python"), "-c", "import site; print(site.getsitepackages()[0])"],
      check=True,
      capture_output=True,
      text=True,
    ).stdout.strip()
    project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(site, "host.pth"), "w", encoding="utf-8") as f:  # this run's packages and project
      f.write("\n".join([*(p for p in sys.path if p.endswith("site-packages")), os.path.join(project, "src"), project]))
    secret = os.path.join(folder, "secret.txt")
    with open(secret, "w", encoding="utf-8") as f:
      f.write(TOKEN)
    probe = (
      "import os, sys\n"
      f"print(repr((sys.prefix, os.getcwd(), os.listdir('.'), os.path.exists({secret!r}), "
      f"os.path.exists({folder + '/venv/bin/python'!r}), os.access({venv!r}, os.W_OK), "
      f"sorted(os.listdir('/tmp')))))"
    )
    script = (
      "from maxtext.integration.tunix import tools\nfrom tests.conftest import make_config\n"
      "cfg = make_config('rl.use_agentic_rollout=true', 'rl.tools=[python]')\n"
      f"print(tools.tool_map(cfg.tools)['python']('python', 'run python').apply(code={probe!r}).output)"
    )
    result = subprocess.run(
      [os.path.join(venv, "bin", "python"), "-c", script],
      cwd=folder,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout.strip().splitlines()[-1]
    prefix, cwd, listing, sees_secret, sees_python, venv_writable, tmp = eval(report)
    assert prefix == venv and sees_python and not venv_writable
    assert listing == [] and not sees_secret
    assert cwd.startswith("/tmp") and tmp == sorted({os.path.basename(folder), os.path.basename(cwd)})
