"""benchmarks/vs_trl.py's shared reward, called the way each trainer calls it."""

import importlib.util
import os

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def _reward():
  spec = importlib.util.spec_from_file_location("vs_trl", os.path.join(BENCHMARKS, "vs_trl.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  namespace = {}
  exec(module.REWARD, namespace)  # pylint: disable=exec-used
  return namespace["last_number_correct"]


def test_the_reward_scores_the_last_number_under_both_calling_conventions():
  reward = _reward()
  completions = ["7 * 8 = 56", "It is 56.0", "56, no wait, 54", "I don't know", "1,056"]
  answers = ["56", "56", "56", "56", "1056"]
  expected = [1.0, 1.0, 0.0, 0.0, 1.0]
  # ours: fn(prompts, completions, tmvp_config, **dataset columns)
  assert reward(["p"] * 5, completions, None, answer=answers, question=["q"] * 5) == expected
  # TRL: every argument by keyword, with its own extras
  assert reward(prompts=["p"] * 5, completions=completions, completion_ids=[[1]] * 5, answer=answers,
                trainer_state=None) == expected
