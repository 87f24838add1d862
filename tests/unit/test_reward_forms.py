"""User reward functions written for TRL, Tunix or MaxText run unchanged: called by keyword through the
real worker pool, each gets exactly what its signature takes; conversations arrive as message lists;
None means "does not apply"; reward_weights weigh them; a file that cannot be called so is refused at
start, naming the function."""

import json
import math

import numpy as np
import pytest

from maxtext import tasks
from maxtext.configs import pyconfig
from maxtext.input_pipeline import rewards
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import errors
from tests.conftest import make_config


def _reward_set(tmp_path, source: str, names: list[str], *overrides) -> rewards.RewardSet:
  path = tmp_path / "my_rewards.py"
  path.write_text(source)
  cfg = make_config(f"reward_functions_path={path}", f"reward_functions=[{','.join(names)}]", *overrides)
  return rewards.reward_functions(tasks.select(cfg.data.dataset_name), cfg.task, cfg.maxtext_view())


_RECORDING = """
import json

def _record(name, **got):
  seen = {{k: (v.reward_exact_answer if k == "tmvp_config" else v) for k, v in got.items()}}
  with open({log!r}, "a") as f:
    f.write(json.dumps({{"name": name, "got": seen}}) + "\\n")

def trl_form(prompts, completions, **kwargs):  # TRL's and Tunix's
  _record("trl_form", prompts=prompts, completions=completions, **kwargs)
  return [1.0] * len(completions)

def check_answer(prompts, completions, answer, **kargs):  # Tunix's
  _record("check_answer", prompts=prompts, completions=completions, answer=answer, **kargs)
  return [float(c == a) for c, a in zip(completions, answer)]

def check_numbers(prompts, completions, answer, tmvp_config, **kargs):  # upstream MaxText's
  _record("check_numbers", prompts=prompts, completions=completions, answer=answer, tmvp_config=tmvp_config, **kargs)
  return [tmvp_config.reward_exact_answer] * len(completions)

def old_form(prompts, completions, tmvp_config, **kwargs):  # MaxText's positional form
  _record("old_form", prompts=prompts, completions=completions, tmvp_config=tmvp_config, **kwargs)
  return [0.0] * len(completions)

def only_named(completions, solution):  # no **kwargs: only what it names
  _record("only_named", completions=completions, solution=solution)
  return [float(len(s)) for s in solution]
"""

_FIELDS = {"question": ["q1", "q2"], "answer": ["42", "7"], "solution": ["ab", "abc"], "mode": "train"}


def test_each_peer_form_gets_exactly_its_arguments(tmp_path):
  log = tmp_path / "calls.jsonl"
  names = ["trl_form", "check_answer", "check_numbers", "old_form", "only_named"]
  reward_set = _reward_set(tmp_path, _RECORDING.format(log=str(log)), names, "reward_exact_answer=5")
  scores, metrics = reward_set.score(["p1", "p2"], ["42", "8"], dict(_FIELDS), group_size=2)
  calls = {c["name"]: c["got"] for c in map(json.loads, log.read_text().splitlines())}
  everything = {"prompts": ["p1", "p2"], "completions": ["42", "8"], "tmvp_config": 5.0, **_FIELDS}
  assert calls["trl_form"] == everything  # **kwargs: every field, the config too
  assert calls["check_answer"] == everything
  assert calls["check_numbers"] == everything
  assert calls["old_form"] == everything
  assert calls["only_named"] == {"completions": ["42", "8"], "solution": ["ab", "abc"]}
  # 1 + check_answer + 5 + 0 + len(solution)
  assert scores.tolist() == [1 + 1 + 5 + 0 + 2, 1 + 0 + 5 + 0 + 3]
  assert metrics["rewards/check_answer"][0] == 0.5 and metrics["rewards/only_named"][0] == 2.5


def test_conversational_data_gives_message_lists(tmp_path):
  source = """
def shapes(prompts, completions, **kwargs):
  assert "prompt" not in kwargs  # it is `prompts`
  assert prompts[0] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}], prompts
  assert completions[1] == [{"role": "assistant", "content": "5"}], completions
  return [1.0] * len(completions)

def plain(prompts, completions, **kwargs):
  assert prompts == ["rendered 1", "rendered 2"] and completions == ["4", "5"], (prompts, completions)
  return [1.0] * len(completions)
"""
  conversation = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
  conversational = _reward_set(tmp_path, source, ["shapes"])
  scores, _ = conversational.score(
    ["rendered 1", "rendered 2"], ["4", "5"], {"prompt": [conversation, conversation]}, group_size=2
  )
  assert scores.tolist() == [1.0, 1.0]
  plain = _reward_set(tmp_path, source, ["plain"])  # a `prompt` of strings is a column like any other
  assert plain.score(["rendered 1", "rendered 2"], ["4", "5"], {"prompt": ["2+2?", "2+3?"]}, 2)[0].tolist() == [1, 1]


def test_trl_reward_functions_score_trl_style_data(tmp_path):
  """TRL's own accuracy_reward and think_format_reward, imported in the user's file, on conversational
  data with a `solution` column; an unparseable solution is TRL's None (skipped)."""
  source = "from trl.rewards import accuracy_reward, think_format_reward\n"
  reward_set = _reward_set(tmp_path, source, ["accuracy_reward", "think_format_reward"])
  conversation = [{"role": "user", "content": "What is 2+2?"}]
  completions = ["<think>2+2</think>\\boxed{4}", "\\boxed{5}", "<think>hm</think>\\boxed{4}", "\\boxed{4}"]
  fields = {"prompt": [conversation] * 4, "solution": ["$4$", "$4$", "$4$", "no math here"]}
  scores, metrics = reward_set.score(["r"] * 4, completions, fields, group_size=2)
  assert scores.tolist() == [2.0, 0.0, 2.0, 0.0]  # accuracy + think format; the last: format only
  assert metrics["rewards/accuracy_reward/nones"][0] == 1 and metrics["rewards/think_format_reward/nones"][0] == 0
  assert metrics["rewards/accuracy_reward"][0] == pytest.approx(2 / 3)  # over the completions it applies to


_PARTIAL = """
def half(completions, **kwargs):
  return [None, 1.0, None, 2.0]

def other(completions, **kwargs):
  return [3.0, None, None, 4.0]
"""


def test_none_skips_a_function_and_weights_weigh_them(tmp_path):
  reward_set = _reward_set(tmp_path, _PARTIAL, ["half", "other"], "reward_weights=[2.0,0.5]")
  scores, metrics = reward_set.score(["p"] * 4, ["a", "b", "c", "d"], {}, group_size=2)
  # 0.5*3; 2*1; none applies: its group's other (6), so advantage 0; 2*2 + 0.5*4
  assert scores.tolist() == [1.5, 2.0, 6.0, 6.0]
  weighted = [1.5, 2.0, 6.0]  # the completions some function applies to
  assert metrics["rewards/sum"][0] == pytest.approx(np.mean(weighted))
  assert metrics["rewards/std"][0] == pytest.approx(np.std(weighted))
  assert metrics["rewards/half"][0] == 1.5 and metrics["rewards/other"][0] == 3.5  # unweighted
  assert metrics["rewards/half/nones"][0] == 2 and metrics["rewards/other/nones"][0] == 2
  assert metrics["rewards/unscored"][0] == 1
  assert all(math.isfinite(v) for v, _ in metrics.values())
  nothing = _reward_set(tmp_path, "def none(completions, **kw):\n  return [None] * len(completions)\n", ["none"])
  scores, metrics = nothing.score(["p", "p"], ["a", "b"], {}, group_size=2)
  assert scores.tolist() == [0.0, 0.0] and "rewards/none" not in metrics and "rewards/sum" not in metrics
  # A NaN is no None: it, an infinity and a value past float32's range name the function at once
  # (the training run stops on it before any update; test_shutdown).
  for value in ("float('nan')", "float('-inf')", "1e39"):
    source = (
      f"def fine(completions, **kw):\n  return [1.0, 1.0]\n\ndef bad(completions, **kw):\n  return [1.0, {value}]\n"
    )
    broken = _reward_set(tmp_path, source, ["fine", "bad"])
    with pytest.raises(rewards.NonFiniteReward, match=r"^rewards/bad: not finite"):
      broken.score(["p", "p"], ["a", "b"], {}, group_size=2)


def test_reward_weights_are_checked_at_start(tmp_path):
  path = tmp_path / "r.py"
  path.write_text("def a(completions, **kw):\n  return [1.0]\n")
  base = (f"reward_functions_path={path}", "reward_functions=[a]")
  assert make_config(*base, "reward_weights=[0.5]").task.reward_weights == (0.5,)
  with pytest.raises(pyconfig.ConfigError, match=r"reward_weights=\[1.0, 2.0\]: expected one weight per function"):
    make_config(*base, "reward_weights=[1.0,2.0]")
  with pytest.raises(pyconfig.ConfigError, match=r"reward_weights=\[.*inf.*\]: expected a list of finite numbers"):
    make_config(*base, "reward_weights=[.inf]")
  with pytest.raises(pyconfig.ConfigError, match=r"reward_weights=\[1.0\]: expected one weight per function"):
    make_config("reward_weights=[1.0]")  # no reward_functions to weigh


def test_a_function_that_cannot_be_called_by_keyword_is_refused_at_load(tmp_path, capsys, monkeypatch):
  from maxtext.trainers.post_train.rl import training_run

  def must_not_run(*args, **kwargs):
    raise AssertionError("the reward file is checked before the data and the model load")

  monkeypatch.setattr(training_run.datasets, "Examples", must_not_run)
  monkeypatch.setattr(training_run, "load_model", must_not_run)
  path = tmp_path / "r.py"
  path.write_text("def fine(completions, **kw):\n  return [1.0]\ndef by_position(prompts, completions, /):\n  pass\n")
  args = ["model_name=qwen3-tiny", f"reward_functions_path={path}", "reward_functions=[fine,by_position]"]
  assert train_rl.main(["train_rl", "rl.yml", f"base_output_directory={tmp_path}", *args]) == 2
  err = capsys.readouterr().err
  assert err.strip().splitlines()[-1] == (
    f"error: reward_functions_path={path}: reward function by_position(prompts, completions, /) takes 'prompts' "
    f"by position only; {rewards.FORMS}"
  )


def test_a_parameter_the_data_lacks_is_refused_before_the_model_loads(tmp_path):
  reward_set = _reward_set(
    tmp_path, "def needs(prompts, completions, solution, tmvp_config, mode):\n  pass\n", ["needs"]
  )
  reward_set.check_fields(["prompts", "question", "answer", "solution"])  # the data has it
  with pytest.raises(errors.InputError) as raised:
    reward_set.check_fields(["prompts", "question", "answer", "user_content"])
  assert str(raised.value) == (
    f"reward_functions_path={tmp_path / 'my_rewards.py'}: reward function needs requires 'solution', which is "
    f"neither prompts, completions, tmvp_config nor a field of the data (answer, prompts, question, "
    f"user_content); {rewards.FORMS}"
  )
