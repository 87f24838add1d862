"""train_rl with a scripted policy (tests/scripted_policy.py): known completions through the real
learners, tools, rewards and metrics."""

import json

import numpy as np
import pytest

from maxtext.checkpoint_conversion import load, orbax_checkpoint
from maxtext.models import builder
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config
from tests.scripted_policy import use_script

TINY = ["model_name=qwen3-tiny", "num_batches=2", "batch_size=2", "num_test_batches=1", "eval_batch_size=2",
        "adam_weight_decay=0", "learning_rate=1e-3", "warmup_steps_fraction=0"]
CALL = '<tool_call>{{"name": "calculator", "arguments": {{"expression": "{}"}}}}</tool_call>'


def _rows(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _reward_file(tmp_path, body):
  path = tmp_path / "rewards.py"
  path.write_text(f"def scripted(prompts, completions, tmvp_config, **kwargs):\n  return {body}\n")
  return [f"reward_functions_path={path}", "reward_functions=[scripted]"]


def _changed(args, run_dir):
  cfg = make_config(*args)
  initial = builder.to_arrays(load.load_model(cfg, create_meshes(cfg)[0]))
  trained = orbax_checkpoint.restore_arrays(str(run_dir / "checkpoints"))
  return sum(not np.array_equal(initial[n], trained[n]) for n in initial) / len(initial)


def tool_script(prompt, n):
  """Per group of three: a direct answer, a calculator call that works and one that fails; after
  a tool result, the answer."""
  if "Tool returned result" in prompt:
    return "<answer>5</answer>"
  return ["<answer>5</answer>", CALL.format("2+3"), CALL.format("1/0")][n % 3]


def test_scripted_tool_calls_are_counted_and_trained(tmp_path, monkeypatch):
  """2 of 3 conversations call a tool and 1 of those 2 calls fails: call frequency 2/3, failure
  frequency 1/2 at every step, and the parameters change."""
  use_script(monkeypatch, tool_script)
  args = [*TINY, "rl.num_generations=3", "max_prompt_length=512", "max_response_length=96",
          "rl.use_agentic_rollout=true", "rl.tools=[calculator]", "rl.max_turns=2",
          *_reward_file(tmp_path, "[float('<tool_call>' in c) for c in completions]"),
          f"base_output_directory={tmp_path}", "run_name=tools"]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  rows = _rows(tmp_path / "tools" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    assert r["tools/call_frequency"] == pytest.approx(2 / 3)
    assert r["tools/failure_frequency"] == pytest.approx(1 / 2)
    assert r["turns/mean"] == pytest.approx((1 + 2 + 2) / 3)
    assert r["rewards/scripted"] == pytest.approx(2 / 3)  # the joined turns of both tool conversations
  assert _changed(args, tmp_path / "tools") > 0.5


def test_agentic_without_staleness_reproduces_standard_grpo_loss(tmp_path, monkeypatch):
  """rl.off_policy_steps=0: the agentic learner trains on what standard GRPO trains on (same data,
  seed and completions), so its per-step loss, KL and rewards equal standard GRPO's."""
  use_script(monkeypatch, lambda prompt, n: ["<answer>72</answer>", "It is 72, I think.", "no idea"][n % 3])
  common = [*TINY, "rl.num_generations=3", "rl.grpo_beta=0.04", "rl.loss_agg_mode=token-mean",
            *_reward_file(tmp_path, "[len(c) / 20 for c in completions]"), f"base_output_directory={tmp_path}"]
  assert train_rl.main(["train_rl", "rl.yml", *common, "run_name=standard"]) == 0
  assert train_rl.main(["train_rl", "rl.yml", *common, "run_name=agentic", "rl.use_agentic_rollout=true",
                        "rl.off_policy_steps=0"]) == 0
  standard, agentic = _rows(tmp_path / "standard" / "metrics.jsonl"), _rows(tmp_path / "agentic" / "metrics.jsonl")
  assert [r["step"] for r in standard] == [r["step"] for r in agentic] == [1, 2]
  for s, a in zip(standard, agentic):
    assert a["rewards/scripted"] == pytest.approx(s["rewards/scripted"])
    assert abs(s["loss"]) > 1e-3
    assert a["loss"] == pytest.approx(s["loss"], rel=1e-5)  # measured: 2e-7 relative at step 2
    assert a["kl"] == pytest.approx(s["kl"], rel=1e-5, abs=1e-7)
    assert a["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-5)
