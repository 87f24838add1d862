"""GRPO learns: the real SmolLM2-135M-Instruct, asked for a random digit, mostly starts its reply
with words ("The number ...": greedy never answers with a digit on the held-out prompts, sampling
does about one time in eight). Rewarded for replies that start with a digit, a few steps of
standard GRPO, and of agentic GRPO with rl.off_policy_steps 0 and 1, make it answer with a digit
greedily; with the reward negated the same run moves the other way. Every test here fails with the
advantage's sign flipped."""

import json
import re

import pytest

from maxtext.inference import decode
from maxtext.integration.tunix import learner
from maxtext.trainers.post_train.rl import train_rl
from tests.conftest import make_config

SYSTEM = "You are a random number generator. Output one digit from 0 to 9 and nothing else."
TRAIN = ["Random digit:", "Give me a random digit:", "Digit, please:", "One random digit:", "A random digit:",
         "Random digit, please:", "Your random digit:", "Quick, a random digit:"]
HELD_OUT = ["Random number:", "Some digit:", "Say a random digit:", "Random digit now:"]
COMMON = ["max_response_length=3", "max_prompt_length=64", "batch_size=4", "rl.num_generations=8",
          "num_batches=4", "learning_rate=5e-5", "warmup_steps_fraction=0", "rl.grpo_beta=0",
          "adam_weight_decay=0", "num_test_batches=1", "eval_batch_size=4", "checkpoint_period=100",
          "answer_format=last_number", "num_epoch=2"]


def starts_with_digit(text: str) -> bool:
  return bool(re.match(r"\s*\d", text))


def _setup(tmp_path, sign: float) -> list[str]:
  """The data files, the template and a reward of +-1 for a reply that starts with a digit."""
  (tmp_path / "train.jsonl").write_text("".join(json.dumps({"question": q, "answer": "0"}) + "\n" for q in TRAIN * 4))
  (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"question": q, "answer": "0"}) + "\n" for q in HELD_OUT * 5))
  (tmp_path / "template.json").write_text(json.dumps({"SYSTEM_PROMPT": SYSTEM, "TEMPLATE": "{question}"}))
  (tmp_path / "reward.py").write_text(
      "import re\n"
      "def digit_first(prompts, completions, tmvp_config, **kwargs):\n"
      f"  return [{sign} * float(bool(re.match(r'\\s*\\d', c))) for c in completions]\n")
  return [f"dataset_name={tmp_path / 'train.jsonl'}", f"eval_dataset_name={tmp_path / 'eval.jsonl'}",
          f"data_template_path={tmp_path / 'template.json'}", f"reward_functions_path={tmp_path / 'reward.py'}",
          "reward_functions=[digit_first]", f"base_output_directory={tmp_path}"]


def _greedy_share(args, run_dir, load: bool) -> float:
  """The share of held-out prompts whose greedy reply starts with a digit, before (load=False) or
  after (the run's last checkpoint) training."""
  weights = [f"load_parameters_path={run_dir / 'checkpoints'}"] if load else []
  cfg = make_config(*args, *weights)
  generate, tokenizer = decode.load_sampler(cfg, learner.Mode.EVAL)
  prompts = [tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                           tokenize=False, add_generation_prompt=True) for q in HELD_OUT]
  return sum(map(starts_with_digit, generate(prompts).text)) / len(HELD_OUT)


def _train(args, name) -> None:
  assert train_rl.main(["train_rl", "rl.yml", *args, f"run_name={name}"]) == 0


@pytest.mark.parametrize("mode", [
    ["rl.use_agentic_rollout=false"],
    ["rl.use_agentic_rollout=true", "rl.off_policy_steps=0", "rl.max_concurrency=32"],
    ["rl.use_agentic_rollout=true", "rl.off_policy_steps=1", "rl.max_concurrency=32"],
], ids=["standard", "agentic_off_policy_0", "agentic_off_policy_1"])
def test_grpo_turns_a_rare_behaviour_into_the_greedy_one(tmp_path, mode):
  args = [*COMMON, *_setup(tmp_path, 1.0)]
  before = _greedy_share(args, tmp_path / "run", load=False)
  _train([*args, *mode], "run")
  after = _greedy_share(args, tmp_path / "run", load=True)
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8")]
  rewards = [r["rewards/mean"] for r in rows]
  print(f"greedy share of digit replies: {before:.2f} before, {after:.2f} after; sampled reward per step {rewards}")
  assert before <= 0.25 and after >= 0.75
  assert rewards[-1] > rewards[0] + 0.3  # the reward curve rises


def test_the_reward_sign_sets_the_direction(tmp_path):
  """Two standard GRPO runs identical but for the reward's sign: the rewarded statistic (the share of
  sampled replies that start with a digit) rises in one and falls in the other."""
  shares = {}
  for sign in (1.0, -1.0):
    folder = tmp_path / f"sign{sign:+.0f}"
    folder.mkdir()
    _train([*COMMON, *_setup(folder, sign), "num_batches=3"], "run")
    rows = [json.loads(line) for line in open(folder / "run" / "metrics.jsonl", encoding="utf-8")]
    shares[sign] = [abs(r["rewards/mean"]) for r in rows]  # the share of digit replies per step
  print(f"share of sampled digit replies per step: rewarded {shares[1.0]}, penalised {shares[-1.0]}")
  assert shares[1.0][-1] > shares[1.0][0] + 0.2
  assert shares[-1.0][-1] <= shares[-1.0][0]
  assert shares[1.0][-1] > shares[-1.0][-1] + 0.3
