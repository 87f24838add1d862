"""The PPO recipes on the default demo's task (slow): rl_ppo_times_table.yml with the task's rule, and
rl_ppo_times_table_reward_model.yml with a reward model that train_reward_model trains first in place of
the rule; each improves held-out greedy accuracy on 200 questions with a paired bootstrap 95% interval
above 0."""

import json

import pytest

from maxtext.configs import pyconfig
from maxtext.trainers.post_train.rl import train_reward_model, train_rl


def _gain(folder, recipe: str, *overrides: str) -> tuple[dict, list[dict]]:
  assert train_rl.main(["train_rl", recipe, f"base_output_directory={folder}", *overrides]) == 0
  run = folder / pyconfig.initialize(["train_rl", recipe, *overrides]).run.run_name
  results = json.loads((run / "eval.json").read_text())
  assert results["before"]["num_examples"] >= 200
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  print(
    f"{recipe}: accuracy {results['before']['accuracy']:.3f} -> {results['after']['accuracy']:.3f}, {results['gain']}"
  )
  return results["gain"], rows


@pytest.mark.slow
def test_the_ppo_recipe_improves_held_out_accuracy(tmp_path):
  gain, rows = _gain(tmp_path, "rl_ppo_times_table.yml")
  assert gain["ci95_low"] > 0
  assert rows[-1]["critic/explained_variance"] > 0.2


@pytest.mark.slow
def test_the_ppo_recipe_on_a_trained_reward_model_improves_held_out_accuracy(tmp_path, capsys):
  model = tmp_path / "reward_models" / "times_table"
  args = [
    "train_reward_model",
    "rl_times_table.yml",
    f"reward_training.output_path={model}",
    f"base_output_directory={tmp_path}",
  ]
  assert train_reward_model.main(args) == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert summary["held_out_accuracy_after"] > 0.75 and summary["held_out_pairs"] >= 40
  gain, rows = _gain(tmp_path, "rl_ppo_times_table_reward_model.yml", f"reward_model.load_parameters_path={model}")
  assert gain["ci95_low"] > 0
  assert all(r["rewards/sum"] == pytest.approx(r["rewards/reward_model"], rel=1e-5, abs=1e-6) for r in rows)
