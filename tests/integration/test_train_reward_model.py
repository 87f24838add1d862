"""The Bradley-Terry command (train_reward_model) and the reward model in a run: pairs are ordered by
the rule rewards; training lowers the Bradley-Terry loss; the checkpoint it writes is an HF
*ForSequenceClassification that transformers loads and scores as reward_model.load_parameters_path does;
GRPO (standard and agentic) and PPO runs pay its score (reward_model.weight, alone) as
rewards/reward_model."""

import contextlib
import io
import json
import os

import numpy as np
import pytest
import torch
import transformers

from maxtext.rl import reward_model
from maxtext.trainers.post_train.rl import train_reward_model, train_rl
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config, template_for

TINY = ["rl.yml", "model_name=qwen3-tiny", "max_response_length=8", "num_test_batches=0"]


def test_preference_pairs_order_each_groups_differing_completions():
  totals = np.array([1.0, 0.0, 1.0, 0.5, 2.0, 2.0, 2.0, 2.0])
  pairs = train_reward_model.preference_pairs(totals, 4, 10, np.random.default_rng(0))
  assert sorted(pairs) == sorted([(0, 1), (0, 3), (2, 1), (3, 1), (2, 3)])  # (0, 2) tie; group 2 all tied
  assert len(train_reward_model.preference_pairs(totals, 4, 2, np.random.default_rng(0))) == 2
  assert train_reward_model.pair_accuracy(np.array([3.0, 1.0, 1.0]), [(0, 1), (1, 2), (2, 0)]) == pytest.approx(1.5 / 3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """The command run once for the module: (its output folder, its arguments, its summary line)."""
  tmp_path = tmp_path_factory.mktemp("reward_model")
  rewards = tmp_path / "length.py"
  rewards.write_text("def longer(prompts, completions, **kwargs):\n  return [float(len(c)) for c in completions]\n")
  out = tmp_path / "reward_model"
  args = [
    *TINY,
    f"reward_functions_path={rewards}",
    "reward_functions=[longer]",
    f"reward_training.output_path={out}",
    "reward_training.num_prompts=16",
    "reward_training.samples_per_prompt=4",
    "reward_training.max_pairs_per_prompt=4",
    "reward_training.num_steps=20",
    "reward_training.learning_rate=1e-3",
    "reward_training.micro_batch_size=8",
    f"base_output_directory={tmp_path}",
  ]
  with contextlib.redirect_stdout(io.StringIO()) as printed:
    assert train_reward_model.main(["train_reward_model", *args]) == 0
  return out, args, json.loads(printed.getvalue().strip().splitlines()[-1])


def test_the_command_writes_a_reward_model_transformers_scores_alike_and_a_run_pays_its_score(trained, tmp_path):
  out, args, summary = trained
  assert summary["completions"] == 64 and summary["train_pairs"] > 20
  assert summary["first_loss"] == pytest.approx(np.log(2), abs=1e-5)  # the head starts at zero
  assert summary["last_loss"] < 0.75 * summary["first_loss"]
  config = json.loads((out / "config.json").read_text())
  assert config["architectures"] == ["Qwen3ForSequenceClassification"] and len(config["id2label"]) == 1

  # What it wrote, read as reward_model.load_parameters_path reads it, scores as transformers does.
  cfg = make_config(*args[1:], f"reward_model.load_parameters_path={out}", "matmul_precision=highest")
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  scorer = reward_model.load_reward_model(
    cfg.reward_model, cfg.model, template_for(cfg, tokenizer), create_meshes(cfg.mesh, False)[0]
  )
  questions = ["What is 2 * 3?", "What is 7 * 9?", "What is 11 * 12?"]
  completions = ["6", "It is 63, since seven nines are sixty-three", "132."]
  texts = scorer.texts(["" for _ in questions], completions, {"question": np.array(questions)})
  theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
  inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
  with torch.no_grad():
    expected = theirs(**inputs).logits[:, 0].numpy()
  assert np.ptp(expected) > 0
  ids = scorer.token_ids(["" for _ in questions], completions, {"question": np.array(questions)})
  np.testing.assert_allclose(scorer.scores(ids), expected, rtol=1e-4, atol=1e-4)

  _pays_its_score(out, tmp_path, "grpo", ["rl.algorithm=grpo"])


@pytest.mark.slow  # the fast test above: standard GRPO pays it
@pytest.mark.parametrize(
  "algorithm, mode",
  [
    ("agentic", ["rl.algorithm=grpo", "rl.use_agentic_rollout=true", "rl.max_concurrency=4"]),
    ("ppo", ["rl.algorithm=ppo"]),
  ],
)
def test_agentic_grpo_and_ppo_pay_its_score(trained, tmp_path, algorithm, mode):
  _pays_its_score(trained[0], tmp_path, algorithm, mode)


def _pays_its_score(out, tmp_path, algorithm: str, mode: list[str]) -> None:
  """A run of `mode` pays the reward model's score alone, at its weight; the rule rewards are still logged."""
  run = [
    *TINY,
    *mode,
    "batch_size=2",
    "num_batches=1",
    "rl.num_generations=2",
    f"reward_model.load_parameters_path={out}",
    "reward_model.weight=2.0",
    "reward_model.alone=true",
    f"base_output_directory={tmp_path}",
    f"run_name={algorithm}",
  ]
  assert train_rl.main(["train_rl", *run]) == 0
  with open(os.path.join(tmp_path, algorithm, "metrics.jsonl"), encoding="utf-8") as f:
    row = json.loads(f.readline())
  assert row["rewards/sum"] == pytest.approx(2.0 * row["rewards/reward_model"], rel=1e-5, abs=1e-6)
  assert any(k.endswith("/nones") and k != "rewards/reward_model/nones" for k in row)  # a rule's metrics
