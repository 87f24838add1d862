"""User errors outside the config: the user's Python files (reward functions, dataset processor,
tools), reward functions that fail, and an output folder that cannot be written. Each is one line
naming the file, function or key; train_rl exits 2 before the model loads (before the data for a
reward file), and the traceback stays in the log at DEBUG."""

import logging
import socket

import pytest

from maxtext import tasks
from maxtext.input_pipeline import rewards
from maxtext.integration.tunix import tools
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import errors, storage, user_code
from tests.conftest import make_config

_SYNTAX = "def r(prompts, completions, tmvp_config, **kwargs)\n  return [0.0 for c in completions]\n"


@pytest.mark.parametrize(
  "text, expected",
  [
    (_SYNTAX, ":1: SyntaxError: expected ':'"),
    ("x = 1\nimport no_such_module_for_maxtext_tests\n", ":2: ModuleNotFoundError: No module named"),
    ("def f():\n  raise KeyError('k')\n\nf()\n", ":2: KeyError: 'k'"),
  ],
)
def test_a_user_file_that_does_not_compile_import_or_run_is_one_line(tmp_path, text, expected):
  """Whichever key names the file: reward functions, a dataset processor or tools."""
  path = tmp_path / "mine.py"
  path.write_text(text)
  for key in ("reward_functions_path", "dataset_processor_path", "rl.tools_path"):
    with pytest.raises(errors.InputError) as raised:
      user_code.load_file(str(path), key)
    assert str(raised.value).startswith(f"{key}={path}{expected}") and "\n" not in str(raised.value)
    assert raised.value.__cause__ is not None  # the traceback, for the log at DEBUG
  with pytest.raises(errors.InputError, match=f"rl.tools_path={path}"):
    tools.user_tools(str(path))


def _bound(tmp_path, body: str):
  path = tmp_path / "my_rewards.py"
  path.write_text(f"def mine(prompts, completions, tmvp_config, question, **kwargs):\n{body}")
  cfg = make_config(f"reward_functions_path={path}", "reward_functions=[mine]")
  [fn] = rewards.reward_functions(tasks.select(cfg.data.dataset_name), cfg.task, cfg.maxtext_view()).functions
  return fn, path


def test_a_reward_function_that_raises_names_itself_and_the_example(tmp_path):
  """Only the second of three examples fails: the batch is rescored one example at a time to find it."""
  fn, path = _bound(tmp_path, "  return [1.0 / len(q.split('zero')[1]) for q in question]\n")
  question = ["one zero x", "two zero", "three zero y"]
  with pytest.raises(errors.InputError) as raised:
    fn(["p1", "prompt two", "p3"], ["a", "completion two", "c"], question=question, mode="train")
  assert str(raised.value) == (
    f"reward_functions_path={path}: reward function mine raised ZeroDivisionError: float division by zero on "
    "completion 1 of 3 (prompt 'prompt two', completion 'completion two')"
  )


def test_a_reward_function_that_returns_non_numbers_names_itself_and_the_example(tmp_path):
  fn, path = _bound(tmp_path, "  return [0.5 if q else 'good' for q in question]\n")
  long_prompt = "x" * 100 + " the end of the prompt"
  with pytest.raises(errors.InputError) as raised:
    fn(["p", long_prompt], ["fine", "b" * 100], question=["q", ""])
  assert str(raised.value) == (
    f"reward_functions_path={path}: reward function mine returned 'good' (str) on completion 1 of 2 "
    f"(prompt '...{long_prompt[-60:]}', completion '{'b' * 60}...'); expected a number or None"
  )


def test_a_reward_file_with_a_syntax_error_exits_2_before_the_data_and_model_load(
  tmp_path, capsys, caplog, monkeypatch
):
  from maxtext.trainers.post_train.rl import training_run

  def must_not_run(*args, **kwargs):
    raise AssertionError("the reward file is checked before the data and the model load")

  monkeypatch.setattr(training_run.datasets, "Examples", must_not_run)
  monkeypatch.setattr(training_run, "load_model", must_not_run)
  path = tmp_path / "rewards.py"
  path.write_text(_SYNTAX)
  caplog.set_level(logging.DEBUG)
  args = ["model_name=qwen3-tiny", f"reward_functions_path={path}", "reward_functions=[r]", "log_level=debug"]
  assert train_rl.main(["train_rl", "rl.yml", f"base_output_directory={tmp_path}", *args]) == 2
  err = capsys.readouterr().err
  assert err.strip().splitlines()[-1] == f"error: reward_functions_path={path}:1: SyntaxError: expected ':'"
  assert "Traceback" not in err
  [logged] = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], errors.InputError)]
  assert logged.levelno == logging.DEBUG  # log_level=debug shows the traceback


def _must_not_load_the_model(monkeypatch):
  from maxtext.trainers.post_train.rl import training_run

  def must_not_run(*args, **kwargs):
    raise AssertionError("the output folder is checked before the model loads")

  monkeypatch.setattr(training_run, "load_model", must_not_run)


def test_a_read_only_output_folder_exits_2_naming_base_output_directory(tmp_path, capsys, monkeypatch):
  _must_not_load_the_model(monkeypatch)
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  for base, reason in (("/sys/maxtext-tests", "Operation not permitted"), (str(a_file), "Not a directory")):
    assert train_rl.main(["train_rl", "rl.yml", "model_name=qwen3-tiny", f"base_output_directory={base}"]) == 2
    err = capsys.readouterr().err
    run_dir = f"{base}/{make_config().run.run_name}"
    assert err.strip().splitlines()[-1] == f"error: base_output_directory={base}: cannot write {run_dir} ({reason})"
    assert "Traceback" not in err


@pytest.fixture(name="unreachable")
def _unreachable(monkeypatch):
  """STORAGE_EMULATOR_HOST on a closed local port, with gcsfs's waits between retries cut to nothing."""
  gcsfs = pytest.importorskip("gcsfs")
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  for name, value in (
    ("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}"),
    ("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{port}"),
    ("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false"),
  ):
    monkeypatch.setenv(name, value)

  class NoWait:
    @staticmethod
    async def sleep(_):
      return None

  monkeypatch.setattr(gcsfs.retry, "asyncio", NoWait)
  gcsfs.GCSFileSystem.clear_instance_cache()  # instances keep the endpoint they were made with
  yield
  gcsfs.GCSFileSystem.clear_instance_cache()


def test_an_unreachable_bucket_is_one_line_not_gcsfs_retry_tracebacks(unreachable, capsys, caplog, monkeypatch):
  _must_not_load_the_model(monkeypatch)
  caplog.set_level(logging.INFO)
  assert train_rl.main(["train_rl", "rl.yml", "model_name=qwen3-tiny", "base_output_directory=gs://bkt/out"]) == 2
  err = capsys.readouterr().err
  run_dir = f"gs://bkt/out/{make_config().run.run_name}"
  last = err.strip().splitlines()[-1]
  assert last.startswith(
    f"error: base_output_directory=gs://bkt/out: cannot write {run_dir} (gave up after 6 attempts: "
    "ClientConnectorError: Cannot connect to host 127.0.0.1:"
  )
  assert "Traceback" not in err and not [r for r in caplog.records if r.exc_info]
  with pytest.raises(errors.InputError, match=r"the bucket cannot be reached \(gave up after 6 attempts: "):
    storage.exists("dataset_name", "gs://bkt/data.jsonl")
  assert not [r for r in caplog.records if r.exc_info]
