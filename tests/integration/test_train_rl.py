"""train_rl end to end: qwen3-tiny through Tunix's GRPO learner, and the full default demo (slow)."""

import gc
import glob
import json
import logging
import os
import re
import signal

import jax
import numpy as np
import pytest
import yaml
from flax import nnx
from PIL import Image

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.configs import pyconfig
from maxtext.inference import decode
from maxtext.integration.tunix import agentic
from maxtext.models import builder, load
from maxtext.models.builder import param_name
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils.mesh import create_meshes
from tests.conftest import hf_greedy_tokens, make_config

TINY = [
  "model_name=qwen3-tiny",
  "num_batches=2",
  "batch_size=2",
  "rl.num_generations=2",
  "max_response_length=16",
  "num_test_batches=1",
  "eval_batch_size=2",
  "adam_weight_decay=0",
  "learning_rate=1e-3",
  "warmup_steps_fraction=0",
]


def _read_jsonl(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


# The task's rewards and one that differs between any two different completions: every group has a
# learning signal, so the steps move the weights whatever the random model writes.
SPREAD_REWARDS = """
from maxtext.tasks.word_problems import check_answer, check_numbers, match_format_approximately, match_format_exactly


def spread(prompts, completions, tmvp_config, **kwargs):
  return [float(sum((i + 1) * ord(ch) for i, ch in enumerate(c)) % 1000) / 1000 for c in completions]
"""


def test_two_grpo_steps_log_rewards_and_change_parameters(tmp_path, capsys, monkeypatch):
  """Also: report.md with its plots, export_hf=true, and every row sent to an (offline) W&B run."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  (tmp_path / "rewards.py").write_text(SPREAD_REWARDS)
  args = [
    *TINY,
    f"base_output_directory={tmp_path}",
    f"reward_functions_path={tmp_path / 'rewards.py'}",
    "reward_functions=[match_format_exactly,match_format_approximately,check_answer,check_numbers,spread]",
    "run_name=tiny",
    "eval_interval=1",
    "export_hf=true",
    "wandb_project=maxtext-tests",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  run = tmp_path / "tiny"

  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert set(summary) == {"before", "during", "after", "gain"} and summary["after"]["num_examples"] == 2
  assert summary["gain"]["num_examples"] == 2  # the paired before/after difference on the same questions
  assert [r["step"] for r in summary["during"]] == [1]  # after step 1; step 2 is the final evaluation
  saved = yaml.safe_load((run / "config.yml").read_text())
  assert saved["model_name"] == "qwen3-tiny" and saved["rl"]["num_generations"] == 2

  rows = _read_jsonl(run / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    for key in (
      "rewards/mean",
      "rewards/match_format_exactly",
      "rewards/match_format_approximately",
      "rewards/check_answer",
      "rewards/check_numbers",
      "kl",
      "loss",
      "step_time_s",
    ):
      assert key in r and np.isfinite(r[key]), key
    assert r["frac_reward_zero_std"] == 0.0 and r["grad_norm"] > 1e-3  # a signal in every group
    assert 0 < r["trainer/idle_fraction"] < 1  # sampling and scoring take part of each step, never all
    # every step, from the loss's forward pass: the same float32 weights on both sides
    assert 0.0 <= r["sampler_trainer/logp_diff_mean"] <= r["sampler_trainer/logp_diff_max"] < 1e-3
    assert r["sampler_trainer/prob_diff_max"] < 1e-3
  # the episode log holds each step's completions, with the rewards (the functions' sum) they trained with
  episodes = _read_jsonl(run / "episodes.jsonl")
  for r in rows:
    step = [e for e in episodes if e["step"] == r["step"]]
    assert len(step) == 4 and all(e["status"] == "trained" and e["prompt_tokens"] > 0 for e in step)
    assert np.mean([e["reward"] for e in step]) == pytest.approx(r["rewards/score/mean"], abs=1e-5)
    assert all(e["messages"][-1]["role"] == "assistant" and "«" in e["tokens"] for e in step)
  assert (run / "tensorboard").is_dir() and os.listdir(run / "tensorboard")
  eval_json = json.loads((run / "eval.json").read_text())
  assert len(eval_json["after"]["examples"]) == 2

  cfg = make_config(*args)
  initial = {
    param_name(p): np.asarray(v.get_value())
    for p, v in nnx.to_flat_state(nnx.state(load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])))
  }
  assert (run / "checkpoints" / "actor" / "2" / "model_params").is_dir()
  flat = orbax_checkpoint.restore_arrays(str(run / "checkpoints"))  # the latest step
  assert set(flat) == set(initial)
  changed = [n for n in initial if not np.array_equal(initial[n], flat[n])]
  assert len(changed) > len(initial) // 2, changed

  report = (run / "report.md").read_text()
  for png in ("reward", "accuracy", "kl", "loss", "response_length", "step_time"):
    assert f"](plots/{png}.png)" in report
    with Image.open(run / "plots" / f"{png}.png") as image:
      assert image.format == "PNG" and image.size == (640, 360)
  assert "| during | 1 |" in report and "| after | 2 |" in report

  [wandb_log] = glob.glob(str(run / "wandb" / "offline-run-*" / "*.wandb"))
  logged = open(wandb_log, "rb").read()
  assert all(key.encode() in logged for key in ("rewards/mean", "kl", "step_time_s"))

  # The HF export is the trained policy: transformers' greedy decode equals ours of the checkpoint.
  capsys.readouterr()
  assert (
    decode.main(
      [
        "decode",
        "rl.yml",
        "model_name=qwen3-tiny",
        f"load_parameters_path={run / 'checkpoints'}",
        "prompt=What is 2+3?",
        "max_response_length=8",
        "decode_sampling_temperature=0",
      ]
    )
    == 0
  )
  ours = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert ours["token_ids"] == hf_greedy_tokens(run / "hf", "What is 2+3?", 8)


def test_the_sampler_on_unrolled_layers_trains_what_the_stacked_layers_train(tmp_path, caplog):
  """rollout_layers=unrolled (a scanned model sampled from its unrolled copy, remade each step) and
  stacked: the same samples, so the same rewards, loss, KL and gradient norm in every step, bit for bit
  on XLA:CPU; each run says at start which it samples from."""
  (tmp_path / "rewards.py").write_text(SPREAD_REWARDS)
  rows = {}
  for layers in ("stacked", "unrolled"):
    caplog.clear()
    args = [
      *(a for a in TINY if not a.startswith(("num_test_batches=", "eval_batch_size="))),
      "num_test_batches=0",
      f"base_output_directory={tmp_path}",
      f"reward_functions_path={tmp_path / 'rewards.py'}",
      "reward_functions=[check_answer,spread]",
      f"run_name={layers}",
      f"rollout_layers={layers}",
    ]
    with caplog.at_level("INFO"):
      assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
    how = "from an unrolled copy" if layers == "unrolled" else "from the stacked arrays"
    assert f"The sampler decodes the scanned layers {how} (rollout_layers)" in caplog.text
    rows[layers] = _read_jsonl(tmp_path / layers / "metrics.jsonl")
  keys = ("rewards/mean", "rewards/spread", "loss", "kl", "grad_norm")
  assert [r["step"] for r in rows["unrolled"]] == [1, 2]
  assert [[r[k] for k in keys] for r in rows["unrolled"]] == [[r[k] for k in keys] for r in rows["stacked"]]
  assert all(r["grad_norm"] > 0 for r in rows["unrolled"])  # the steps trained


@pytest.mark.slow  # make test: test_scan_layers.py's logits, cache, decode and gradients
def test_scan_layers_trains_as_the_unrolled_decoder_does(tmp_path, capsys):
  """scan_layers=true: the same seeded weights, samples and rewards in each step, and the same loss,
  KL and gradient norm within 1e-4, as the unrolled decoder's run. A rerun that changes scan_layers
  is refused naming it, rather than failing in the checkpoint's restore."""
  (tmp_path / "rewards.py").write_text(SPREAD_REWARDS)
  rows = {}
  for scan in ("false", "true"):
    args = [
      *TINY,
      f"base_output_directory={tmp_path}",
      f"reward_functions_path={tmp_path / 'rewards.py'}",
      "reward_functions=[check_answer,spread]",
      f"run_name=scan_{scan}",
      f"scan_layers={scan}",
    ]
    assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
    rows[scan] = _read_jsonl(tmp_path / f"scan_{scan}" / "metrics.jsonl")
  assert [r["step"] for r in rows["true"]] == [r["step"] for r in rows["false"]] == [1, 2]
  for unrolled, scanned in zip(rows["false"], rows["true"]):
    assert (
      scanned["rewards/mean"] == unrolled["rewards/mean"] and scanned["rewards/spread"] == unrolled["rewards/spread"]
    )
    for key in ("loss", "kl", "grad_norm"):
      assert abs(scanned[key] - unrolled[key]) <= 1e-4, (key, scanned[key], unrolled[key])
  capsys.readouterr()
  rerun = ["train_rl", "rl.yml", *args[:-2], "run_name=scan_true", "scan_layers=false"]
  assert train_rl.main(rerun) == 2  # a key that shapes training, as config.yml says
  assert "scan_layers: True -> False" in capsys.readouterr().err
  assert train_rl.main([*rerun, "resume_with_changes=true"]) == 2  # the checkpoints' layout cannot change
  assert "scan_layers=false: the run's checkpoints hold the decoder layers stacked" in capsys.readouterr().err
  # A run written unrolled (scan_layers=false, the default before) resumed with the default, in one line.
  old = ["train_rl", "rl.yml", *args[:-2], "run_name=scan_false"]
  assert make_config(*old[2:]).model.scan_layers
  assert train_rl.main(old) == 2
  assert "scan_layers: False -> True" in capsys.readouterr().err
  assert train_rl.main([*old, "resume_with_changes=true"]) == 2
  refusal = [line for line in capsys.readouterr().err.splitlines() if "the run's checkpoints hold" in line]
  assert len(refusal) == 1 and refusal[0].endswith(
    "scan_layers=true: the run's checkpoints hold the decoder layers one per layer (written with "
    "scan_layers=false); resume with scan_layers=false, or start a new run from them (load_parameters_path "
    "and lora_input_adapters_path load either layout)"
  ), refusal
  # Another model shape is refused in one line from the checkpoint's own shapes, with config.yml (and
  # resume_with_changes) or without it.
  reshaped = ["train_rl", "rl.yml", *args[:-2], "run_name=scan_true", "emb_dim=128", "mlp_dim=256"]
  for attempt in ("with_changes", "without_config_yml"):
    if attempt == "without_config_yml":
      os.remove(tmp_path / "scan_true" / "config.yml")
    extra = ["resume_with_changes=true"] if attempt == "with_changes" else []
    assert train_rl.main([*reshaped, *extra]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "holds checkpoints of another model" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    shapes = r"holds checkpoints of another model: \S+ is \[.*64.*\] there but \[.*128.*\] in this config"
    assert re.search(shapes, lines[0]), lines[0]


def test_num_iterations_counts_steps_as_batches_through_a_resume(tmp_path, capsys, caplog):
  """rl.num_iterations=2: num_batches=3 trains 3 batches in 6 optimizer updates; metrics.jsonl has one
  row per batch, checkpoints are taken every checkpoint_period batches, and a run stopped after 2
  batches resumes at the third, each step logged once. The runs skip evaluation (num_test_batches=0)."""
  args = [
    *[a for a in TINY if not a.startswith(("num_test_batches", "eval_batch_size"))],
    "num_test_batches=0",
    "rl.num_iterations=2",
    "checkpoint_period=1",
    "max_num_checkpoints_to_keep=5",
    f"base_output_directory={tmp_path}",
    "run_name=mu2",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0  # num_batches=2
  run = tmp_path / "mu2"
  # num_test_batches=0: no evaluation; the summary and eval.json hold none, report.md says so.
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {
    "before": None,
    "during": [],
    "after": None,
    "gain": None,
  }
  assert json.loads((run / "eval.json").read_text())["after"] is None
  assert "configured without evaluation (num_test_batches=0)" in (run / "report.md").read_text()
  assert [r["step"] for r in _read_jsonl(run / "metrics.jsonl")] == [1, 2]
  # Named by optimizer update: every checkpoint_period steps of 2 updates, nothing mid-batch.
  assert orbax_checkpoint.steps(str(run / "checkpoints" / "actor")) == [2, 4]
  # A third batch changes the learning-rate schedule: the rerun resumes with that change.
  caplog.clear()
  with caplog.at_level(logging.INFO):
    assert train_rl.main(["train_rl", "rl.yml", *args, "num_batches=3", "resume_with_changes=true"]) == 0
  # The console says what the rerun trains, and a line per step with its reward, KL, loss and time.
  assert "Training steps 3 to 3 of 3;" in caplog.text and "Trained steps 3 to 3 in " in caplog.text
  assert re.search(r"step 3/3: reward -?\d+\.\d{3}, kl \S+, loss \S+, \d", caplog.text)
  rows = _read_jsonl(run / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert all(np.isfinite(r["loss"]) and "rewards/mean" in r for r in rows)
  # against the trainer's log-probs before the step's first update, also in its second update
  assert all(0.0 <= r["sampler_trainer/logp_diff_max"] < 1e-3 for r in rows)
  assert orbax_checkpoint.steps(str(run / "checkpoints" / "actor")) == [2, 4, 6]
  caplog.clear()
  with caplog.at_level(logging.INFO):
    assert train_rl.main(["train_rl", "rl.yml", *args, "num_batches=3"]) == 0
  assert "Nothing left to train: the run's 3 of 3 steps were trained before this rerun" in caplog.text
  assert "Trained steps" not in caplog.text and "step 3/3" not in caplog.text


def test_evaluation_keys_are_refused_without_evaluation(capsys):
  from maxtext.trainers.post_train.rl import evaluate_rl

  with pytest.raises(pyconfig.ConfigError, match="eval_interval=1: .*num_test_batches=0 runs no evaluation"):
    make_config("num_test_batches=0", "eval_interval=1")
  with pytest.raises(pyconfig.ConfigError, match="num_test_batches=-1: expected 0 \\(no evaluation\\) or a positive"):
    make_config("num_test_batches=-1")
  assert evaluate_rl.main(["evaluate_rl", "rl.yml", "num_test_batches=0"]) == 2
  assert "num_test_batches=0: evaluate_rl has nothing to evaluate" in capsys.readouterr().err


def test_config_error_exits_2_and_names_key(capsys):
  assert train_rl.main(["train_rl", "rl.yml", "rl.max_concurency=64"]) == 2
  assert "rl.max_concurency: unknown key" in capsys.readouterr().err


def test_real_model_answers_paris(smollm2_tokenizer):
  """The shipped SmolLM2 GGUF and its tokenizer decode correctly through Tunix's sampler."""
  from tunix.rl.rollout import base_rollout

  from maxtext.integration.tunix.rollout import RolloutEngine

  cfg = make_config()
  mesh, _ = create_meshes(cfg.mesh, agentic=False)
  model = load.load_model(cfg.model, mesh)
  config = base_rollout.RolloutConfig(
    max_tokens_to_generate=16,
    max_prompt_length=64,
    kv_cache_size=80,
    temperature=0.0,
    top_p=None,
    top_k=None,
    eos_tokens=[smollm2_tokenizer.eos_token_id],
  )
  engine = RolloutEngine(model, smollm2_tokenizer, mesh, config, seed=0)
  prompt = smollm2_tokenizer.apply_chat_template(
    [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
  )
  out = engine.generate([prompt], config)
  assert out.text[0] == "The capital of France is Paris."
  assert out.tokens[0][-1] == smollm2_tokenizer.eos_token_id


@pytest.mark.slow
def test_default_demo(tmp_path):
  """`make run`'s job (rl_times_table.yml): SmolLM2-135M-Instruct GRPO that improves held-out greedy
  accuracy on at least 200 questions, with a paired bootstrap 95% interval above 0 and a rising reward."""
  assert train_rl.main(["train_rl", "rl_times_table.yml", f"base_output_directory={tmp_path}"]) == 0
  cfg = pyconfig.initialize(["train_rl", "rl_times_table.yml"])
  rows = _read_jsonl(tmp_path / cfg.run.run_name / "metrics.jsonl")
  assert [r["step"] for r in rows] == list(range(1, cfg.train.num_batches + 1))
  results = json.loads((tmp_path / cfg.run.run_name / "eval.json").read_text())
  assert results["before"]["num_examples"] == cfg.eval.num_test_batches * cfg.eval.eval_batch_size >= 200
  gain = results["gain"]
  print(f"accuracy {results['before']['accuracy']:.3f} -> {results['after']['accuracy']:.3f}, gain {gain}")
  assert gain["ci95_low"] > 0
  rewards = [r["rewards/mean"] for r in rows]
  assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3
  assert "Accuracy gain after training" in (tmp_path / cfg.run.run_name / "report.md").read_text()


def test_custom_reward_file_and_processor_end_to_end(tmp_path):
  """A user reward file and dataset processor drive a training step; their reward is logged by name."""
  rewards = tmp_path / "rewards.py"
  rewards.write_text(
    "def brevity(prompts, completions, tmvp_config, **kwargs):\n  return [1.0 / (1 + len(c)) for c in completions]\n"
  )
  proc = tmp_path / "proc.py"
  proc.write_text(
    "def process_data(dataset_name, model_tokenizer, template_config, tmvp_config, x):\n"
    "  msgs = [{'role': 'user', 'content': 'Q: ' + x['question']}]\n"
    "  prompt = model_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)\n"
    "  return {'prompts': prompt, 'question': x['question'], 'answer': x['answer'].split('####')[-1].strip()}\n"
  )
  args = [
    *TINY,
    "num_batches=1",
    f"reward_functions_path={rewards}",
    "reward_functions=[brevity]",
    f"dataset_processor_path={proc}",
    f"base_output_directory={tmp_path}",
    "run_name=custom",
    "rollout_engine=vanilla",
  ]  # the other tests train on the default engine, batched
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  [row] = _read_jsonl(tmp_path / "custom" / "metrics.jsonl")
  assert 0 < row["rewards/brevity"] <= 1 and "rewards/check_numbers" not in row
  examples = json.loads((tmp_path / "custom" / "eval.json").read_text())["after"]["examples"]
  assert examples[0]["question"] and examples[0]["answer"].lstrip("-").isdigit()


@pytest.mark.slow
def test_trl_and_tunix_reward_forms_train_weighted(tmp_path):
  """A TRL-style reward (**kwargs, None where it does not apply) and Tunix's check_answer(prompts,
  completions, answer, **kargs) train a step, weighted by reward_weights; the logged rewards are TRL's."""
  rewards = tmp_path / "rewards.py"
  rewards.write_text(
    "def brevity(completions, **kwargs):\n"
    "  return [None if i == 0 else 1.0 / (1 + len(c)) for i, c in enumerate(completions)]\n"
    "def check_answer(prompts, completions, answer, **kargs):\n"
    "  return [float(a in c) for c, a in zip(completions, answer)]\n"
  )
  args = [
    *(a for a in TINY if not a.startswith(("num_test_batches=", "eval_batch_size="))),
    "num_batches=1",
    "num_test_batches=0",
    "max_response_length=8",
    f"reward_functions_path={rewards}",
    "reward_functions=[brevity,check_answer]",
    "reward_weights=[2.0,1.0]",
    f"base_output_directory={tmp_path}",
    "run_name=forms",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  [row] = _read_jsonl(tmp_path / "forms" / "metrics.jsonl")
  assert row["rewards/brevity/nones"] == 1 and row["rewards/unscored"] == 0  # one call of 4 completions
  assert 0 < row["rewards/brevity"] <= 1 and 0 <= row["rewards/check_answer"] <= 1
  assert np.isfinite(row["rewards/sum"]) and np.isfinite(row["rewards/std"])


# Records what the reward functions are given, as TRL gives it for conversational data: the conversations
# as `prompts`, each completion as an assistant message, and the dataset's other columns by name.
SEEN_REWARDS = """
import json, os


def seen(prompts, completions, solution, id, **kwargs):
  with open(os.path.join(os.path.dirname(__file__), "seen.jsonl"), "a") as f:
    for p, c, s, i in zip(prompts, completions, solution, id):
      f.write(json.dumps({"prompt": list(p), "completion": list(c), "solution": str(s), "id": int(i)}) + "\\n")
  return [0.0] * len(completions)
"""


def test_a_trl_conversational_dataset_trains(tmp_path):
  """A TRL-style jsonl (a conversation with a system turn as `prompt`, a `solution`, an `id`) trains
  unchanged: its conversations are the prompts, and every column reaches the reward functions."""
  rows = [
    {
      "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i} + {i}?"}],
      "solution": str(2 * i),
      "id": i,
    }
    for i in range(4)
  ]
  data = tmp_path / "conversations.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "rewards.py").write_text(SEEN_REWARDS)
  args = [
    "model_name=qwen3-tiny",
    "num_batches=2",
    "batch_size=2",
    "rl.num_generations=2",
    "max_response_length=8",
    "num_test_batches=0",
    f"dataset_name={data}",
    "train_fraction=1.0",
    f"reward_functions_path={tmp_path / 'rewards.py'}",
    "reward_functions=[seen]",
    f"base_output_directory={tmp_path}",
    "run_name=trl",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  seen = _read_jsonl(tmp_path / "seen.jsonl")
  assert len(seen) == 2 * 2 * 2  # 2 steps of 2 prompts, 2 completions each
  for record in seen:
    row = rows[record["id"]]
    assert (record["prompt"], record["solution"]) == (row["prompt"], row["solution"])
    [message] = record["completion"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
  assert len(_read_jsonl(tmp_path / "trl" / "metrics.jsonl")) == 2


def test_a_reward_function_that_fails_mid_run_exits_2_and_keeps_the_checkpoints(tmp_path, capsys):
  """A user's reward function that raises at step 2 (out of Tunix's training loop): one line naming it
  and the example, exit 2, step 1's checkpoint and metrics kept whole."""
  rewards = tmp_path / "rewards.py"
  rewards.write_text(
    "CALLS = []\n"
    "def flaky(prompts, completions, tmvp_config, **kwargs):\n"
    "  CALLS.append(1)\n"
    "  return [0.0 if len(CALLS) == 1 else {}['score'] for c in completions]\n"
  )
  args = [
    *TINY,
    "num_batches=3",
    "max_response_length=8",
    "checkpoint_period=1",
    f"reward_functions_path={rewards}",
    "reward_functions=[flaky]",
    f"base_output_directory={tmp_path}",
    "run_name=flaky",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err
  assert re.fullmatch(
    f"error: reward_functions_path={re.escape(str(rewards))}: reward function flaky raised KeyError: 'score' on "
    r"completion 0 of 4 \(prompt '.*', completion '.*'\)",
    err.strip().splitlines()[-1],
  )
  run = tmp_path / "flaky"
  assert orbax_checkpoint.steps(str(run / "checkpoints" / "actor")) == [1]
  assert [r["step"] for r in _read_jsonl(run / "metrics.jsonl")] == [1]


def test_a_reward_function_that_fails_in_agentic_grpo_is_one_line(tmp_path, capsys):
  """Agentic GRPO scores groups on its producer (Tunix's event loop), and train() raises the reward
  function's error: it is still the one line, exit 2."""
  rewards = tmp_path / "rewards.py"
  rewards.write_text(
    "def strings(prompts, completions, tmvp_config, **kwargs):\n  return ['good' for c in completions]\n"
  )
  args = [
    *TINY,
    "num_batches=1",
    "max_response_length=8",
    "rl.use_agentic_rollout=true",
    "rl.max_concurrency=2",
    f"reward_functions_path={rewards}",
    "reward_functions=[strings]",
    f"base_output_directory={tmp_path}",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err and " ERROR " not in err
  assert re.fullmatch(
    f"error: reward_functions_path={re.escape(str(rewards))}: reward function strings returned 'good' \\(str\\) "
    r"on completion 0 of 2 \(prompt '.*', completion '.*'\); expected a number or None",
    err.strip().splitlines()[-1],
  )


def _flat_or_coin(tmp_path) -> list[str]:
  """A run of 3 steps of 4 prompts x 4 samples where half the questions get reward 0 whatever the
  reply (groups without signal), the others a coin flip per reply, with dynamic sampling on."""
  (tmp_path / "data.jsonl").write_text(
    "".join(
      json.dumps({"question": f"{kind} {i}", "answer": "1"}) + "\n" for i in range(8) for kind in ("flat", "coin")
    )
  )
  (tmp_path / "rewards.py").write_text(
    "import zlib\n"
    "def coin(prompts, completions, tmvp_config, question, **kwargs):\n"
    "  coin = lambda c: float(zlib.crc32(c.encode()) % 2)\n"
    "  return [0.0 if q.startswith('flat') else coin(c) for q, c in zip(question, completions)]\n"
  )
  return [
    *[a for a in TINY if not a.startswith("eval_batch_size")],
    "num_batches=3",
    "batch_size=4",
    "train_micro_batch_size=2",
    "rl.num_generations=4",
    "max_response_length=8",
    "num_test_batches=0",
    f"dataset_name={tmp_path / 'data.jsonl'}",
    f"reward_functions_path={tmp_path / 'rewards.py'}",
    "reward_functions=[coin]",
    f"base_output_directory={tmp_path}",
    "rl.dynamic_sampling=true",
    "rl.dynamic_sampling_max_rounds=6",
  ]


def _assert_dynamic_sampling(rows: list[dict]) -> None:
  """Every step trained groups with signal only, drawn over more than one round somewhere."""
  assert len(rows) == 3
  for row in rows:
    assert row["frac_reward_zero_std"] == 0.0 and row["dynamic_sampling/short"] == 0.0
    assert 0.0 < row["dynamic_sampling/sampled_zero_std_fraction"] < 1.0
  assert max(row["dynamic_sampling/rounds"] for row in rows) >= 2


def test_dynamic_sampling_trains_only_groups_with_signal_and_shaping_takes_effect(tmp_path):
  """rl.dynamic_sampling (_flat_or_coin): every step trains batch_size groups whose rewards differ,
  drawn over several rounds (the step's whole batch is sampled and filled at once, also with train
  micro-batches). With it: the overlong punishment of replies that fill the budget, the masking of
  truncated replies, and the sampler importance correction with the log-prob mismatch logged."""
  args = [
    *_flat_or_coin(tmp_path),
    "run_name=dapo",
    "rl.overlong_buffer_length=4",
    "rl.overlong_penalty=0.5",
    "rl.mask_truncated_completions=true",
    "rl.sampler_is=token",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  rows = _read_jsonl(tmp_path / "dapo" / "metrics.jsonl")
  _assert_dynamic_sampling(rows)
  for row in rows:
    # random weights rarely stop: a reply of the full 8 tokens gets the whole penalty and trains no token
    assert row["completions/min_length"] == 8
    assert row["rewards/overlong_penalty"] == pytest.approx(-0.5)
    assert row["completions/masked_truncated_fraction"] == pytest.approx(1.0)
    assert 0.0 <= row["sampler_trainer/logp_diff_mean"] < 1e-3  # the same float32 weights on both sides
  # with every token masked there is no policy gradient: the loss is 0
  assert all(row["loss"] == 0.0 for row in rows)


def test_agentic_dynamic_sampling_trains_only_groups_with_signal(tmp_path):
  """rl.dynamic_sampling in agentic GRPO (_flat_or_coin): a group without signal gives its slot to a
  reserve prompt, sampled while the rest of the step is in flight; every step trains batch_size
  groups whose rewards differ. With the sampler importance correction the trainer recomputes the
  old policy's log-probs (vocabulary slice by slice), which agree with the sampler's."""
  args = [
    *_flat_or_coin(tmp_path),
    "rl.use_agentic_rollout=true",
    "rl.max_concurrency=8",
    "rl.sampler_is=token",
    "run_name=agentic_dapo",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  rows = _read_jsonl(tmp_path / "agentic_dapo" / "metrics.jsonl")
  _assert_dynamic_sampling(rows)
  for row in rows:  # group scoring logs these from the trainer's recomputed log-probs
    assert 0.0 <= row["sampler_trainer/logp_diff_mean"] < 1e-3 and row["sampler_trainer/logp_diff_max"] < 1e-2


def _host_arrays() -> set[int]:
  """The ids of the live arrays in host memory (pinned_host)."""
  return {id(a) for a in jax.live_arrays() if a.sharding.memory_kind == "pinned_host"}


def test_agentic_grpo_trains_on_full_length_completions(tmp_path, monkeypatch):
  """rl.use_agentic_rollout=true: Tunix's agentic learner with our engine, parser and rewards."""
  rewards = tmp_path / "rewards.py"
  rewards.write_text(
    "def variety(prompts, completions, tmvp_config, **kwargs):\n  return [len(set(c)) / 10 for c in completions]\n"
  )
  args = [
    *TINY,
    "num_batches=3",
    "rl.use_agentic_rollout=true",
    "rl.max_concurrency=4",
    "rollout_engine=batched",
    f"reward_functions_path={rewards}",
    "reward_functions=[variety]",
    f"base_output_directory={tmp_path}",
    "run_name=agentic",
  ]
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
  gc.collect()
  host_copies = _host_arrays()
  kept: list[int] = []  # host arrays alive, beside those before the run, as training starts and after each step
  learner = agentic.AgenticGRPOLearner
  train, next_step = learner.train, learner._next_global_step

  def count() -> None:
    gc.collect()
    kept.append(len(_host_arrays() - host_copies))

  monkeypatch.setattr(learner, "train", lambda self, *a, **k: count() or train(self, *a, **k))
  monkeypatch.setattr(learner, "_next_global_step", lambda self, *a: next_step(self, *a) or count())
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  # The trainer recomputes no log-probs (the sampler's are the old policy's): RLCluster's host copy
  # of the weights is never read, and none is kept while training.
  assert len(kept) == 4 and max(kept) == 0
  # Tunix's agentic learner installs handlers that kill the process; the caller's are put back.
  assert {s: signal.getsignal(s) for s in handlers} == handlers
  # No host copy of the weights (RLCluster's anchor policy state) outlives the run.
  gc.collect()
  assert _host_arrays() <= host_copies
  rows = _read_jsonl(tmp_path / "agentic" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2, 3]
  for r in rows:
    assert r["generation/completions/mean_length"] == 16  # the random model never stops: full budget
    assert r["rewards/variety"] > 0 and np.isfinite(r["loss"])
  assert 0 < rows[0]["trainer/idle_fraction"] <= 1  # the trainer waits for the first samples
  # Every step the loss compares the trainer's log-probs with the sampler's (the old policy's), and
  # they agree (on-policy); the trainer recomputes none.
  for r in rows:
    assert 0.0 <= r["sampler_trainer/logp_diff_mean"] < 1e-4 and r["sampler_trainer/logp_diff_max"] < 1e-3
    assert r["sampler_trainer/logp_diff_mean"] == pytest.approx(r["log_ratio/abs_mean"], abs=1e-7)
    assert "sampler_trainer/probs_pearson_corr" not in r  # Tunix's metric of its own recomputation
  # Conversations share the chat template's system prompt and a group its question: prompt tokens are
  # read from reused KV prefixes, but never all of them.
  reuse = [r["rollout/prefix_reuse_fraction"] for r in rows]
  assert all(0.3 < x < 1 for x in reuse)
  cfg = make_config(*args)
  initial = builder.to_arrays(load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0]))
  # A decode step reads every weight and shares it among at most rl.max_concurrency busy rows.
  weights = sum(a.nbytes for a in initial.values())
  for r in rows:
    assert r["rollout/decode_tokens_per_s"] > 0
    assert weights / 4 <= 1e9 * r["rollout/decode_gb_per_s"] / r["rollout/decode_tokens_per_s"] <= 2 * weights
  trained = builder.per_layer(orbax_checkpoint.restore_arrays(str(tmp_path / "agentic" / "checkpoints")))
  assert sum(not np.array_equal(initial[n], trained[n]) for n in initial) > len(initial) // 2


def test_failed_agentic_rollout_fails_the_run_instead_of_hanging(tmp_path, monkeypatch):
  """Tunix logs a model-call exception and waits forever for the group; the run must raise it."""
  from maxtext.integration.tunix import agentic
  from maxtext.integration.tunix.rollout import BatchedRolloutEngine

  calls = []
  real_generate = BatchedRolloutEngine.generate

  def failing_generate(self, prompts, rollout_config, **kwargs):
    calls.append(len(prompts))
    if len(calls) > 3:  # the evaluation before training and a few rollouts succeed
      raise ValueError("injected sampler failure")
    return real_generate(self, prompts, rollout_config, **kwargs)

  monkeypatch.setattr(BatchedRolloutEngine, "generate", failing_generate)

  def hung(*_):
    raise TimeoutError("the run hung after a failed rollout")

  previous = signal.signal(signal.SIGALRM, hung)
  signal.alarm(300)
  try:
    with pytest.raises(agentic.RolloutError, match="injected sampler failure"):
      train_rl.main(
        [
          "train_rl",
          "rl.yml",
          *TINY,
          "rl.use_agentic_rollout=true",
          "rl.max_concurrency=2",
          "rollout_engine=batched",
          f"base_output_directory={tmp_path}",
          "run_name=failing",
        ]
      )
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
  assert (tmp_path / "failing" / "eval.json").is_file()  # what was saved before the failure stays


@pytest.mark.slow
def test_agentic_at_max_concurrency_256(tmp_path):
  """Load: 16 prompts x 4 samples per step with off_policy_steps=3 puts up to 256 conversations in
  flight on the batched engine; gradient accumulation keeps the trainer's memory bounded."""
  args = [
    *TINY,
    "num_batches=3",
    "batch_size=16",
    "rl.num_generations=4",
    "train_micro_batch_size=2",
    "rl.use_agentic_rollout=true",
    "rl.max_concurrency=256",
    "rl.off_policy_steps=3",
    "rollout_engine=batched",
    f"base_output_directory={tmp_path}",
    "run_name=load",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  rows = _read_jsonl(tmp_path / "load" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert all(np.isfinite(r["loss"]) and r["staleness/max"] <= 3 for r in rows)


@pytest.mark.slow  # test_scripted_policy runs the python tool in the fast suite
def test_agentic_with_tools_runs_and_logs_tool_metrics(tmp_path):
  """rl.tools with the shipped tool-use template: tool-calling conversations of up to rl.max_turns."""
  template = os.path.join(os.path.dirname(pyconfig.__file__), "templates", "tool_use_rl.json")
  args = [
    *TINY,
    "num_batches=1",
    "max_prompt_length=1024",
    "rl.use_agentic_rollout=true",
    "rl.tools=[calculator, python]",
    "rl.max_turns=2",
    f"data_template_path={template}",
    f"base_output_directory={tmp_path}",
    "run_name=tools",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  [row] = _read_jsonl(tmp_path / "tools" / "metrics.jsonl")
  for key in ("tools/call_frequency", "tools/failure_frequency", "turns/mean"):
    assert key in row and np.isfinite(row[key])
  assert 1 <= row["turns/mean"] <= 2
