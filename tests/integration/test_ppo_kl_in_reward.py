"""PPO's KL penalty inside the reward (rl.kl_in_reward_coef) in a run: with no KL in the loss
(rl.grpo_beta=0) the reference is kept and scores every completion; the penalty is about 0 while the policy
is the reference (step 1) and below 0 once it has moved (step 2); its key is refused with GRPO."""

import json
import os

import pytest

from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils.errors import InputError
from tests.conftest import make_config


def test_the_kl_penalty_inside_the_reward_grows_as_the_policy_leaves_the_reference(tmp_path):
  args = [
    "rl.yml",
    "model_name=qwen3-tiny",
    "max_response_length=8",
    "num_test_batches=0",
    "batch_size=4",
    "num_batches=2",
    "rl.algorithm=ppo",
    "rl.num_generations=1",
    "rl.grpo_beta=0.0",
    "rl.kl_in_reward_coef=0.5",
    "rl.kl_in_reward_method=mse_kl",
    "learning_rate=3e-3",
    f"base_output_directory={tmp_path}",
    "run_name=kl",
  ]
  assert train_rl.main(["train_rl", *args]) == 0
  with open(os.path.join(tmp_path, "kl", "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  first, second = rows[0]["rewards/kl_penalty"], rows[1]["rewards/kl_penalty"]
  assert abs(first) < 1e-4  # the sampling policy is the reference
  assert second < -1e-3  # mse_kl > 0 once the policy has moved: a penalty
  assert rows[1]["kl"] > 0  # the loss's KL metric (rl.grpo_beta=0: logged, not in the loss)
  # PPO's episodes are logged as GRPO's are: 4 a step, each with the reward functions' reward
  with open(os.path.join(tmp_path, "kl", "episodes.jsonl"), encoding="utf-8") as f:
    episodes = [json.loads(line) for line in f]
  assert [e["step"] for e in episodes] == [1] * 4 + [2] * 4
  assert all(e["trained_tokens"] > 0 and e["completion_tokens"] <= 8 for e in episodes)


def test_kl_in_reward_keys_are_refused_where_they_do_nothing():
  with pytest.raises(InputError, match=r"rl.kl_in_reward_coef"):
    make_config("rl.kl_in_reward_coef=0.1")  # GRPO
  with pytest.raises(InputError, match=r"rl.kl_in_reward_method"):
    make_config("rl.algorithm=ppo", "rl.num_generations=1", "rl.kl_in_reward_method=mse_kl")  # coefficient 0
