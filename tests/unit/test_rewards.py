"""Reward functions on hand-written completions, with hand-computed scores."""

import numpy as np
import pytest

from maxtext import tasks
from maxtext.input_pipeline import rewards
from maxtext.tasks import answers, word_problems
from tests.conftest import make_config

CFG = make_config().task
# Defaults: exact format 3.0, partial 0.5 per tag, format penalty -0.5 per tag, exact answer 3.0,
# whitespace match 1.5, within 10% 0.5, within 20% 0.25, wrong answer -1.0.
GOOD = "<reasoning>6 times 7</reasoning>\n<answer>42</answer>"


def _reward_functions(cfg):
  """The run's reward functions, as train_rl binds them."""
  return rewards.reward_functions(tasks.select(cfg.data.dataset_name), cfg.task, cfg.maxtext_view()).functions


@pytest.mark.parametrize(
  "completion, expected",
  [
    (GOOD, 3.0),
    ("  " + GOOD + "\n", 3.0),
    ("<reasoning>x</reasoning> <answer>42</answer> trailing words", 0.0),
    ("<answer>42</answer>", 0.0),
    ("no tags at all", 0.0),
  ],
)
def test_match_format_exactly(completion, expected):
  assert word_problems.match_format_exactly(None, [completion], CFG) == [expected]


@pytest.mark.parametrize(
  "completion, expected",
  [
    (GOOD, 4 * 0.5),  # every tag once
    ("<answer>42</answer>", 2 * 0.5 + 2 * -0.5),  # reasoning tags missing
    ("no tags", 4 * -0.5),
    (GOOD + "<answer>1</answer>", 2 * 0.5 + 2 * -0.5),  # answer tags repeated
  ],
)
def test_match_format_approximately(completion, expected):
  assert word_problems.match_format_approximately(None, [completion], CFG) == [pytest.approx(expected)]


@pytest.mark.parametrize(
  "completion, truth, expected",
  [
    (GOOD, "42", 3.0),  # exact
    ("<answer> 42 </answer>", "42", 1.5),  # equal after stripping
    ("<answer>44</answer>", "42", 0.5),  # within 10%
    ("<answer>50</answer>", "42", 0.25),  # within 20%
    ("<answer>100</answer>", "42", -1.0),  # wrong
    ("<answer>forty-two</answer>", "42", -1.0),  # no number
    ("The answer is 42", "42", 0.0),  # no answer block
  ],
)
def test_check_answer(completion, truth, expected):
  assert word_problems.check_answer(None, [completion], CFG, answer=[truth]) == [expected]


@pytest.mark.parametrize(
  "completion, truth, expected",
  [
    (GOOD, "42", 3.0),
    ("<answer>$1,234.00 dollars</answer>", "1234", 3.0),  # currency, comma, unit
    ("<answer>-5</answer>", "-5", 3.0),  # negative
    ("<answer>5</answer>", "-5", -1.0),
    ("<answer>1</answer> then <answer>7</answer>", "7", 3.0),  # last answer block counts
    ("<answer>about 3 or 7</answer>", "7", 3.0),  # last number in the block
    ("<answer>none</answer>", "7", -1.0),
    ("7", "7", 0.0),
    ("<answer>\\boxed{\\frac{1}{2}}</answer>", "0.5", 3.0),  # nested braces, math_verify equivalence
    ("<answer>so \\boxed{12} not 13</answer>", "12", 3.0),  # the boxed value, not the last number
    ("<answer>15 (balls)</answer>", "15", 3.0),  # units after the number
    ("<answer>-1,500.5</answer>", "-1500.5", 3.0),  # negative with a thousands comma
  ],
)
def test_check_numbers(completion, truth, expected):
  assert word_problems.check_numbers(None, [completion], CFG, answer=[truth]) == [expected]


def test_weights_come_from_config():
  cfg = make_config("reward_exact_answer=10", "penalty_incorrect_answer=-7").task
  assert word_problems.check_numbers(None, [GOOD, "<answer>1</answer>"], cfg, answer=["42", "42"]) == [10.0, -7.0]


def test_bound_reward_keeps_name_and_batch():
  fn = rewards.bind_config(word_problems.check_numbers, CFG)
  assert fn.__name__ == "check_numbers"
  assert fn(prompts=["p", "p"], completions=[GOOD, "x"], answer=["42", "42"], question=["q", "q"]) == [3.0, 0.0]


def test_last_boxed_handles_nesting():
  assert answers.last_boxed("a \\boxed{1} b \\boxed{\\frac{3}{\\sqrt{4}}} c") == "\\frac{3}{\\sqrt{4}}"
  assert answers.last_boxed("\\boxed{unclosed") is None


def _hangs(guess, truth):
  import time

  time.sleep(600)
  return True


def test_math_verify_deadline_scores_zero_and_never_hangs():
  """Checks that outlive math_verify_timeout score as wrong, within the deadline; the pool recovers."""
  import time

  hanging = answers.MathVerifier(check=_hangs)
  start = time.monotonic()
  assert hanging.equivalent([("1", "1"), ("2", "2")], timeout=3.0, num_procs=1) == [None, None]
  assert time.monotonic() - start < 30  # the worker pool starts, then the 3 s deadline
  hanging.close()
  real = answers.MathVerifier()
  assert real.equivalent([("\\frac{1}{2}", "0.5"), ("3", "4")], timeout=60.0, num_procs=1) == [True, False]
  real.close()


def test_custom_reward_file_replaces_builtins(tmp_path):
  path = tmp_path / "my_rewards.py"
  path.write_text(
    "def length_penalty(prompts, completions, tmvp_config, **kwargs):\n"
    "  return [-len(c) / 100 for c in completions]\n"
    "def broken(prompts, completions, tmvp_config, **kwargs):\n"
    "  raise RuntimeError('boom')\n"
    "def short(prompts, completions, tmvp_config, **kwargs):\n"
    "  return [1.0]\n"
  )
  cfg = make_config(f"reward_functions_path={path}", "reward_functions=[length_penalty]")
  [fn] = _reward_functions(cfg)
  assert fn.__name__ == "length_penalty" and fn(["p", "p"], ["abcd", "ab"]) == [-0.04, -0.02]
  for name, message in (
    ("broken", "reward function broken raised RuntimeError: boom"),
    ("short", "reward function short returned 1 values for 2 completions"),
  ):
    [bad] = _reward_functions(make_config(f"reward_functions_path={path}", f"reward_functions={name}"))
    with pytest.raises(rewards.RewardFunctionError, match=message):
      bad(["p", "p"], ["a", "b"])
  with pytest.raises(ValueError, match=r"\['nope'\] not defined"):
    _reward_functions(make_config(f"reward_functions_path={path}", "reward_functions=[nope]"))
  with pytest.raises(FileNotFoundError, match="reward_functions_path="):
    _reward_functions(make_config(f"reward_functions_path={tmp_path / 'x.py'}", "reward_functions=[a]"))


def test_reasoning_start_token_in_prompt_is_read_back():
  cfg = make_config("reasoning_start_token_in_prompt=true")
  [fn, *_] = _reward_functions(cfg)
  assert fn(["p"], ["6 times 7</reasoning><answer>42</answer>"]) == [3.0]


def test_math_verify_timeout_scores_zero(monkeypatch):
  monkeypatch.setattr(answers._VERIFIER, "equivalent", lambda pairs, timeout, num_procs: [None] * len(pairs))
  assert word_problems.check_numbers(None, ["<answer>x^2</answer>", GOOD], CFG, answer=["4", "42"]) == [0.0, 3.0]


@pytest.mark.parametrize(
  "completion, truth, expected",
  [
    ("She has 7 + 5 = 12 apples.", "12", 3.0),  # the last number is judged
    ("12 apples? No: 7 + 5 = 13.", "12", 0.0),
    ("It costs $1,250 in total", "1250", 3.0),  # currency and thousands commas
    ("I do not know.", "12", 0.0),  # no number: 0, like a wrong one
    ("The answer is 0.5", "1/2", 3.0),  # math_verify equivalence
  ],
)
def test_last_number_answer_format(completion, truth, expected):
  cfg = make_config("answer_format=last_number")
  (reward,) = _reward_functions(cfg)
  assert reward.__name__ == "last_number_correct"
  assert reward(["q"], [completion], answer=[truth]) == [expected]


def test_a_left_out_sample_gets_its_groups_others_mean():
  """Hand-computed: groups of 3; the left-out samples take the mean of their group's others (0 where
  the whole group is left out), so the others' baseline is theirs alone."""
  values = np.array([1.0, -2.0, 4.0, 5.0, 6.0, 7.0])
  left_out = np.array([False, True, False, True, True, True])
  np.testing.assert_array_equal(rewards.others_mean_where(values, left_out, 3), [1.0, 2.5, 4.0, 0.0, 0.0, 0.0])
