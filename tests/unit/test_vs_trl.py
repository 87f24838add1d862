"""benchmarks/vs_trl.py's shared reward, called the way each trainer calls it, and its peak-RSS reading
(shared with train_cost.py)."""

import importlib.util
import os
import subprocess
import sys

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def _vs_trl():
  spec = importlib.util.spec_from_file_location("vs_trl", os.path.join(BENCHMARKS, "vs_trl.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _reward():
  namespace = {}
  exec(_vs_trl().REWARD, namespace)
  return namespace["last_number_correct"]


def test_the_reward_scores_the_last_number_under_both_calling_conventions():
  reward = _reward()
  completions = ["7 * 8 = 56", "It is 56.0", "56, no wait, 54", "I don't know", "1,056"]
  answers = ["56", "56", "56", "56", "1056"]
  expected = [1.0, 1.0, 0.0, 0.0, 1.0]
  # ours: fn(prompts, completions, tmvp_config, **dataset columns)
  assert reward(["p"] * 5, completions, None, answer=answers, question=["q"] * 5) == expected
  # TRL: every argument by keyword, with its own extras
  assert (
    reward(prompts=["p"] * 5, completions=completions, completion_ids=[[1]] * 5, answer=answers, trainer_state=None)
    == expected
  )


def test_peak_rss_is_read_back_in_decimal_gigabytes_and_is_the_childs_own():
  module = _vs_trl()
  parent = bytearray(10**9)  # getrusage's ru_maxrss would hand this parent's peak to the child across exec
  code = module.PEAK_PRELUDE + "x = bytearray(300 * 10**6)"
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert 0.3 < module.peak_gb(proc.stderr) < 0.5  # 300 MB buffer plus the interpreter
  assert module.peak_gb("peak_rss_kb=1000000\n") == 1.024
  del parent


def test_without_torch_our_process_cannot_import_torch():
  """--ours-without-torch: our process runs as where PyTorch is not installed."""
  code = _vs_trl().WITHOUT_TORCH + "import torch"
  proc = subprocess.run([sys.executable, "-c", "import sys; " + code], capture_output=True, text=True, check=False)
  assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr
  assert subprocess.run([sys.executable, "-c", "import torch"], check=False).returncode == 0
