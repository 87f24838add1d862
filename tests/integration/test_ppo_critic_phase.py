"""PPO's critic phase does not depend on how the step is sampled or trained in parts: a run whose rollout
is micro-batched (rollout_max_batch_size=2: the engine decodes the step's 8 completions two at a time)
and whose policy trains in micro-batches (train_micro_batch_size=1) samples the same completions and
gives its critic the same update on the step's whole batch as the plain run (one phase a step, logged
once), and the policy's whitened advantages are over that whole batch."""

import json

import pytest

from maxtext.trainers.post_train.rl import train_rl

RUN = (
  "rl.yml",
  "model_name=qwen3-tiny",
  "max_response_length=8",
  "num_test_batches=0",
  "batch_size=4",
  "num_batches=2",
  "rl.algorithm=ppo",
  "rl.num_generations=2",
  "rl.gae_lambda=1.0",  # with rl.gamma=1 each token's return is its completion's reward
  "critic.mini_batch_size=4",  # the critic's own updates: two a step in both runs
  "learning_rate=3e-3",
)
CRITIC = (
  "critic/value_loss",
  "critic/grad_norm",
  "critic/values_mean",
  "critic/returns_mean",
  "critic/explained_variance",
  "critic/vf_clipfrac",
)


def _run(tmp_path, name: str, *overrides: str) -> tuple[list[dict], list[dict]]:
  args = ["train_rl", *RUN, *overrides, f"base_output_directory={tmp_path}", f"run_name={name}"]
  assert train_rl.main(args) == 0
  folder = tmp_path / name
  metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
  episodes = [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]
  return metrics, episodes


def test_a_micro_batched_rollout_gives_the_critic_the_same_phase_on_the_whole_step(tmp_path):
  plain, plain_episodes = _run(tmp_path, "plain", "rollout_max_batch_size=8")
  parts, parts_episodes = _run(tmp_path, "parts", "rollout_max_batch_size=2", "train_micro_batch_size=1")
  first = [e for e in plain_episodes if e["step"] == 1]
  assert len(first) == 8  # 4 prompts x 2 samples
  # the same completions of step 1 (the engine draws each prompt's sample with its own key)
  assert [(e["tokens"], e["reward"]) for e in first] == [
    (e["tokens"], e["reward"]) for e in parts_episodes if e["step"] == 1
  ]
  assert len(plain) == len(parts) == 2  # one row of critic metrics a step
  for name in CRITIC:
    assert parts[0][name] == pytest.approx(plain[0][name], rel=1e-5, abs=1e-7), name
    assert name in parts[1]
  # the critic's targets are the step's whole batch: with gamma = lambda = 1 and no KL in the reward each
  # live token's return is its completion's reward, so their mean is the token-weighted mean of the 8
  tokens = sum(e["trained_tokens"] for e in first)
  returns = sum(e["reward"] * e["trained_tokens"] for e in first) / tokens
  assert parts[0]["critic/returns_mean"] == pytest.approx(returns, rel=1e-5, abs=1e-6)
