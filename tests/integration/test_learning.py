"""GRPO and PPO learn: the real SmolLM2-135M-Instruct, asked for a random digit (the random_digit task),
mostly starts its reply with words ("The number ...": greedy never answers with a digit on the held-out
prompts, sampling does about one time in eight). Rewarded for replies that start with a digit, a few
steps of standard GRPO, and of agentic GRPO with rl.off_policy_steps 0 and 1, make it answer with a
digit greedily (train_rl's own greedy evaluation of the held-out prompts, before and after), and so does
PPO with a learned critic; with the reward negated the same run moves the other way. Every test here
fails with the advantage's sign flipped. Slow tests train LoRA adapters the same way, and agentic GRPO
on a reward that needs the calculator (the calculator_products task: two demonstrated calls in its
template's EXAMPLES). Each training runs in a fresh Python process (as `python -m ...train_rl` does), so
the suite's memory does not pile up across them."""

import importlib.util
import json
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor

import pytest

from maxtext.configs.sections import TEMPLATE_DIR
from maxtext.tasks import random_digit
from maxtext.trainers.post_train.rl import train_rl

COMMON = [
  "max_response_length=3",
  "max_prompt_length=40",
  "batch_size=4",
  "rl.num_generations=8",
  "num_batches=3",
  "learning_rate=5e-5",
  "warmup_steps_fraction=0",
  "rl.grpo_beta=0",
  "adam_weight_decay=0",
  "num_test_batches=2",
  "eval_batch_size=4",
  "eval_sampling_strategy=greedy",
  "checkpoint_period=100",
  "num_epoch=2",
]


def starts_with_digit(text: str) -> bool:
  return bool(re.match(r"\s*\d", text))


def _setup(folder, sign: float) -> list[str]:
  """The random_digit task (its reward: 1 for a reply that starts with a digit); with sign -1 that
  reward negated, through a reward file."""
  args = ["dataset_name=random_digit", f"base_output_directory={folder}"]
  if sign < 0:
    (folder / "reward.py").write_text(
      "from maxtext.tasks import random_digit\n"
      "def negated_digit_first(prompts, completions, tmvp_config, **kwargs):\n"
      "  return [-r for r in random_digit.digit_first(prompts, completions, tmvp_config, **kwargs)]\n"
    )
    args += [f"reward_functions_path={folder / 'reward.py'}", "reward_functions=[negated_digit_first]"]
  return args


def _learn(folder, sign: float, mode: list[str]) -> dict:
  """One train_rl run: the greedy share of held-out replies that start with a digit before and after
  training (from its eval.json), and the share of sampled replies that do, per step."""
  assert train_rl.main(["train_rl", "rl.yml", *COMMON, *_setup(folder, sign), *mode, "run_name=run"]) == 0
  evals = json.loads((folder / "run" / "eval.json").read_text())

  def greedy_share(result):
    replies = [p["completion"] for ex in result["examples"] for p in ex["passes"]]
    return sum(map(starts_with_digit, replies)) / len(replies)

  rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
  return {
    "before": greedy_share(evals["before"]),
    "after": greedy_share(evals["after"]),
    "sampled": [abs(r["rewards/mean"]) for r in rows],
  }


def _in_fresh_process(fn, *args):
  """fn(*args) in a new Python process; its model, compiled programs and buffers go with it."""
  with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
    return pool.submit(fn, *args).result()


def _check_learned(run: dict) -> None:
  print(
    f"greedy share of digit replies: {run['before']:.2f} before, {run['after']:.2f} after; "
    f"sampled share per step {run['sampled']}"
  )
  assert run["before"] <= 0.25 and run["after"] >= 0.75
  assert run["sampled"][-1] > run["sampled"][0] + 0.3  # the reward curve rises


def test_standard_grpo_learns_and_the_reward_sign_sets_the_direction(tmp_path):
  """Two standard GRPO runs identical but for the reward's sign: the rewarded one turns the rare
  behaviour into the greedy one; the share of sampled digit replies rises in one and falls in the other."""
  runs = {}
  for sign in (1.0, -1.0):
    folder = tmp_path / f"sign{sign:+.0f}"
    folder.mkdir()
    runs[sign] = _in_fresh_process(_learn, folder, sign, ["rl.use_agentic_rollout=false"])
  print(f"share of sampled digit replies per step: rewarded {runs[1.0]['sampled']}, penalised {runs[-1.0]['sampled']}")
  _check_learned(runs[1.0])
  assert runs[-1.0]["sampled"][-1] <= runs[-1.0]["sampled"][0]
  assert runs[1.0]["sampled"][-1] > runs[-1.0]["sampled"][-1] + 0.3
  assert runs[-1.0]["after"] == 0.0


@pytest.mark.slow  # the fast suite's standard and agentic runs learn; the variants below move with the sign
def test_rloo_advantages_with_the_cispo_loss_learn(tmp_path):
  """A non-default estimator and loss together (leave-one-out advantages, CISPO's truncated importance
  weights) learn the rare behaviour as the default does."""
  _check_learned(
    _in_fresh_process(
      _learn, tmp_path, 1.0, ["rl.use_agentic_rollout=false", "rl.advantage_estimator=rloo", "rl.policy_loss_fn=cispo"]
    )
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  "variant",
  [
    ["rl.advantage_estimator=dr_grpo"],
    ["rl.advantage_estimator=rloo"],
    ["rl.advantage_estimator=reinforce_pp"],
    ["rl.policy_loss_fn=cispo"],
    ["rl.loss_algo=gspo-token"],
    ["rl.dynamic_sampling=true", "rl.epsilon_high=0.28", "rl.loss_agg_mode=token-mean"],
    ["rl.sampler_is=token", "rl.sampler_is_threshold=1.5"],
    ["rollout_dtype=bfloat16"],
  ],
  ids=["dr_grpo", "rloo", "reinforce_pp", "cispo", "gspo_token", "dapo", "sampler_is", "bfloat16_rollouts"],
)
def test_each_algorithm_variant_moves_with_the_reward_sign(tmp_path, variant):
  """Per estimator and loss family (and with rollouts sampled from a bfloat16 copy of the policy):
  the rewarded and the negated run move apart."""
  runs = {}
  for sign in (1.0, -1.0):
    folder = tmp_path / f"sign{sign:+.0f}"
    folder.mkdir()
    runs[sign] = _in_fresh_process(_learn, folder, sign, ["rl.use_agentic_rollout=false", *variant])
  print(
    f"{variant}: sampled digit replies per step: rewarded {runs[1.0]['sampled']}, penalised {runs[-1.0]['sampled']}"
  )
  _check_learned(runs[1.0])
  assert runs[-1.0]["sampled"][-1] <= runs[-1.0]["sampled"][0]
  assert runs[1.0]["sampled"][-1] > runs[-1.0]["sampled"][-1] + 0.3


# off_policy_steps=0 in the slow suite: the fast suite shows its loss equals standard GRPO's
# (test_scripted_policy) and that both standard and off-policy agentic GRPO learn.
@pytest.mark.parametrize("off_policy_steps", [pytest.param(0, marks=pytest.mark.slow), 1])
def test_agentic_grpo_learns(tmp_path, off_policy_steps):
  _check_learned(
    _in_fresh_process(
      _learn,
      tmp_path,
      1.0,
      ["rl.use_agentic_rollout=true", f"rl.off_policy_steps={off_policy_steps}", "rl.max_concurrency=32"],
    )
  )


@pytest.mark.slow
def test_agentic_grpo_learns_from_an_openenv_environment_and_its_reward_sign_sets_the_direction(
  tmp_path, openenv_python
):
  """The random_digit rule as an OpenEnv environment (tests/environments/openenv_digit.py, written with
  OpenEnv's API and served from OpenEnv's own venv by the run: rl.agent=openenv, environment.command):
  its step's reward trains the policy, which answers with a digit greedily after three steps; with the
  environment's reward negated (--sign -1) the same run moves the other way."""
  env = os.path.join(os.path.dirname(__file__), "..", "environments", "openenv_digit.py")
  runs = {}
  for sign in (1.0, -1.0):
    folder = tmp_path / f"sign{sign:+.0f}"
    folder.mkdir()
    command = f"{openenv_python} {env} --port {{port}} --sign {sign:g}"
    mode = [
      "rl.use_agentic_rollout=true",
      "rl.max_concurrency=32",
      "rl.agent=openenv",
      f"environment.command={command}",
    ]
    runs[sign] = _in_fresh_process(_learn, folder, 1.0, mode)  # the environment's reward, not the task's
  print(f"sampled digit replies per step: rewarded {runs[1.0]['sampled']}, penalised {runs[-1.0]['sampled']}")
  _check_learned(runs[1.0])
  assert runs[-1.0]["sampled"][-1] <= runs[-1.0]["sampled"][0]
  assert runs[1.0]["sampled"][-1] > runs[-1.0]["sampled"][-1] + 0.3


def _sampled(folder, mode: list[str]) -> list[float]:
  """One train_rl run without evaluation: the share of sampled replies that start with a digit, per step."""
  common = [a for a in COMMON if not a.startswith(("eval_", "num_test_batches="))]
  assert train_rl.main(["train_rl", "rl.yml", *common, f"base_output_directory={folder}", *mode, "run_name=run"]) == 0
  rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
  return [abs(r["rewards/mean"]) for r in rows]


@pytest.mark.slow
def test_agentic_grpo_learns_from_a_verifiers_environment_and_its_reward_sign_sets_the_direction(
  tmp_path, verifiers_python
):
  """The random_digit rule as a verifiers SingleTurnEnv (tests/environments/verifiers_digit.py, written with
  verifiers' API and played in its own venv: rl.agent=verifiers): its dataset is the run's data and its
  rubric the reward, which makes sampled replies start with a digit; with the rubric negated
  (its argument sign=-1) the same run moves the other way. (The run's held-out evaluation is
  refused with a verifiers environment, so the sampled share is the measure.)"""
  env = os.path.join(os.path.dirname(__file__), "..", "environments", "verifiers_digit.py")
  with open(os.path.join(TEMPLATE_DIR, "random_digit.json"), encoding="utf-8") as f:
    system_prompt = json.load(f)["SYSTEM_PROMPT"]  # the random_digit task's prompts, as the other runs here
  runs = {}
  for sign in (1.0, -1.0):
    folder = tmp_path / f"sign{sign:+.0f}"
    folder.mkdir()
    mode = [
      "rl.use_agentic_rollout=true",
      "rl.max_concurrency=32",
      "num_test_batches=0",  # refused with a verifiers environment: the sampled share is the measure
      "rl.agent=verifiers",
      f"environment.id={env}",
      "environment.args=" + json.dumps({"prompts": random_digit.TRAIN, "system_prompt": system_prompt, "sign": sign}),
      f"environment.python={verifiers_python}",
    ]
    runs[sign] = _in_fresh_process(_sampled, folder, mode)
  print(f"verifiers: sampled digit replies per step: rewarded {runs[1.0]}, penalised {runs[-1.0]}")
  # Measured: rewarded 0.19, 0.97, 1.0; negated 0.19, 0.0, 0.0 (1:50 for both runs)
  assert runs[1.0][-1] > runs[1.0][0] + 0.3  # the reward curve rises
  assert runs[-1.0][-1] <= runs[-1.0][0]
  assert runs[1.0][-1] > runs[-1.0][-1] + 0.3


# Measured: sampled digit replies per step 0.06, 0.88, 0.97 (greedy 0.0 -> 1.0); negated 0.06, 0.0, 0.0
# (greedy 0.0 -> 0.0); 2-3.5 minutes per run, peak RSS 6.6-6.9 GB. In the slow suite: the fast suite
# has LoRA's mechanics (test_lora) and full fine-tuning's learning.
@pytest.mark.slow
def test_lora_grpo_learns_and_the_reward_sign_sets_the_direction(tmp_path):
  """The same task and runs, training rank-16 LoRA adapters instead of the full weights."""
  runs = {}
  for sign in (1.0, -1.0):
    folder = tmp_path / f"sign{sign:+.0f}"
    folder.mkdir()
    runs[sign] = _in_fresh_process(
      _learn, folder, sign, ["rl.use_agentic_rollout=false", "lora_rank=16", "lora_alpha=32", "learning_rate=5e-4"]
    )
  _check_learned(runs[1.0])
  assert runs[-1.0]["sampled"][-1] <= runs[-1.0]["sampled"][0]
  assert runs[-1.0]["after"] == 0.0


# Measured: sampled digit replies per step 0.06, 0.88, 0.97 (greedy 0.0 -> 1.0); negated 0.06, 0.0, 0.0
# (greedy 0.0 -> 0.0); 2.5-3.5 minutes per run. In the slow suite: the fast suite has PPO's arithmetic
# against references, its critic and a resumed PPO run (test_ppo_math, test_critic, test_kills).
@pytest.mark.slow
def test_ppo_learns_and_the_reward_sign_sets_the_direction(tmp_path):
  """PPO with a learned critic and one sample per prompt, at GRPO's 32 samples a step: the rewarded
  run turns the rare behaviour into the greedy one; the negated run moves the other way."""
  ppo = ["rl.use_agentic_rollout=false", "rl.algorithm=ppo", "rl.num_generations=1", "batch_size=32", "num_epoch=3"]
  runs = {}
  for sign in (1.0, -1.0):
    folder = tmp_path / f"sign{sign:+.0f}"
    folder.mkdir()
    runs[sign] = _in_fresh_process(_learn, folder, sign, ppo)
  print(f"PPO: sampled digit replies per step: rewarded {runs[1.0]['sampled']}, penalised {runs[-1.0]['sampled']}")
  _check_learned(runs[1.0])
  assert runs[-1.0]["sampled"][-1] <= runs[-1.0]["sampled"][0]
  assert runs[1.0]["sampled"][-1] > runs[-1.0]["sampled"][-1] + 0.3
  assert runs[-1.0]["after"] == 0.0


def _learn_tool_use(folder, agent: list[str]) -> list[dict]:
  """An agentic run of the calculator_products task: "What is a * b?" for four-digit a and two-digit b,
  rewarded when the reply's last number is the product, which SmolLM2-135M cannot compute itself.
  The task's template demonstrates two calculator calls, each with its result and the answer
  (EXAMPLES); with them about half of the sampled conversations call the calculator well and answer
  with its result (15 of 32 in a probe at temperature 0.9; with one demonstration 1 of 16). `agent`:
  the settings that give the model the calculator. Returns metrics.jsonl's rows (no evaluation:
  train_rl's evaluation samples one turn without tools)."""
  args = [
    "train_rl",
    "rl.yml",
    "dataset_name=calculator_products",
    "train_fraction=0.9",
    "reward_exact_answer=1.0",
    f"base_output_directory={folder}",
    "run_name=run",
    "rl.use_agentic_rollout=true",
    *agent,
    "rl.off_policy_steps=1",
    "rl.max_concurrency=16",
    "max_prompt_length=440",
    "max_response_length=80",
    "batch_size=2",
    "rl.num_generations=8",
    "num_batches=6",
    "learning_rate=5e-5",
    "warmup_steps_fraction=0",
    "rl.grpo_beta=0",
    "adam_weight_decay=0",
    "num_test_batches=0",
    "checkpoint_period=100",
    "remat_policy=full",
    "train_micro_batch_size=1",
  ]
  assert train_rl.main(args) == 0
  return [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_agentic_grpo_learns_to_call_the_calculator(tmp_path):
  """The share of conversations that call the calculator and answer with its result rises (sampled,
  per step: the mean of the last two steps against the first two)."""
  rows = _in_fresh_process(_learn_tool_use, tmp_path, ["rl.tools=[calculator]", "rl.max_turns=2"])
  rewards = [r["rewards/mean"] for r in rows]
  calls = [r["tools/call_frequency"] for r in rows]
  failures = [r["tools/failure_frequency"] for r in rows]
  print(f"rewarded share per step {rewards}; tool-call share {calls}; failed-call share {failures}")
  assert sum(rewards[-2:]) / 2 >= sum(rewards[:2]) / 2 + 0.2
  assert sum(calls[-2:]) >= sum(calls[:2])


@pytest.mark.slow
def test_the_calculator_agent_written_against_the_openai_client_learns_through_the_served_policy(tmp_path):
  """The same run with the calculator agent of src/maxtext/agents/calculator.py (rl.agent: function
  calling through the `openai` client, the policy served over HTTP) instead of rl.tools: the rewarded
  share rises as it does in process, and the log-probs the server recorded for the sampled tokens are
  the trainer's for those tokens at step 1 (the weights that sampled them)."""
  agent = importlib.util.find_spec("maxtext.agents.calculator").origin
  rows = _in_fresh_process(_learn_tool_use, tmp_path, [f"rl.agent={agent}:run"])
  rewards = [r["rewards/mean"] for r in rows]
  calls = [r["agent/calls_per_episode"] for r in rows]
  print(
    f"rewarded share per step {rewards}; calls per episode {calls}; mismatch {rows[0]['sampler_trainer/logp_diff_max']}"
  )
  assert sum(rewards[-2:]) / 2 >= sum(rewards[:2]) / 2 + 0.2
  assert sum(calls[-2:]) >= sum(calls[:2])
  assert sum(r["agent/failed_episodes"] + r["agent/mismatched_calls"] for r in rows) == 0
  assert rows[0]["staleness/max"] == 0 and rows[0]["sampler_trainer/logp_diff_max"] < 1e-3
