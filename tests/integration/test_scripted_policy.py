"""train_rl with a scripted policy (tests/scripted_policy.py): known completions through the real
learners, tools, rewards and metrics."""

import json

import numpy as np
import pytest

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.integration.tunix import agentic
from maxtext.models import builder, load
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config
from tests.scripted_policy import use_script

TINY = [
  "model_name=qwen3-tiny",
  "num_batches=2",
  "batch_size=2",
  "num_test_batches=1",
  "eval_batch_size=2",
  "adam_weight_decay=0",
  "learning_rate=1e-3",
  "warmup_steps_fraction=0",
  "rollout_engine=vanilla",
]  # the script replaces the engine and, like vanilla, returns no log-probs
CALL = '<tool_call>{{"name": "python", "arguments": {{"code": "{}"}}}}</tool_call>'


def _rows(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _reward_file(tmp_path, body):
  path = tmp_path / "rewards.py"
  path.write_text(f"def scripted(prompts, completions, tmvp_config, **kwargs):\n  return {body}\n")
  return [f"reward_functions_path={path}", "reward_functions=[scripted]"]


def _changed(args, run_dir):
  cfg = make_config(*args)
  initial = builder.to_arrays(load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0]))
  trained = builder.per_layer(orbax_checkpoint.restore_arrays(str(run_dir / "checkpoints")))  # either layout
  return sum(not np.array_equal(initial[n], trained[n]) for n in initial) / len(initial)


def tool_script(prompt, n):
  """Per group of three: a direct answer, a python call that works and one the sandbox stops (it
  reads /etc/passwd); after a tool result, the answer."""
  if "Tool returned result" in prompt:
    return "<answer>5</answer>"
  return ["<answer>5</answer>", CALL.format("print(2 + 3)"), CALL.format("print(open('/etc/passwd').read())")][n % 3]


def test_scripted_tool_calls_are_counted_and_trained(tmp_path, monkeypatch):
  """Through the sandboxed python tool, 2 of 3 conversations call a tool and 1 of those 2 calls
  fails: call frequency 2/3, failure frequency 1/2 at every step, and the parameters change."""
  use_script(monkeypatch, tool_script)
  args = [
    *TINY,
    "rl.num_generations=3",
    "max_prompt_length=512",
    "max_response_length=96",
    "rl.use_agentic_rollout=true",
    "rl.tools=[python]",
    "rl.max_turns=2",
    *_reward_file(tmp_path, "[float('<tool_call>' in c) for c in completions]"),
    f"base_output_directory={tmp_path}",
    "run_name=tools",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  rows = _rows(tmp_path / "tools" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  assert sum(r["tools/calls"] for r in rows) == 2 * 4 and sum(r["tools/failed_calls"] for r in rows) == 4
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
  common = [
    *TINY,
    "rl.num_generations=3",
    "rl.grpo_beta=0.04",
    "rl.loss_agg_mode=token-mean",
    *_reward_file(tmp_path, "[len(c) / 20 for c in completions]"),
    f"base_output_directory={tmp_path}",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *common, "run_name=standard"]) == 0
  assert (
    train_rl.main(
      ["train_rl", "rl.yml", *common, "run_name=agentic", "rl.use_agentic_rollout=true", "rl.off_policy_steps=0"]
    )
    == 0
  )
  standard, agentic = _rows(tmp_path / "standard" / "metrics.jsonl"), _rows(tmp_path / "agentic" / "metrics.jsonl")
  assert [r["step"] for r in standard] == [r["step"] for r in agentic] == [1, 2]
  for s, a in zip(standard, agentic):
    assert a["rewards/scripted"] == pytest.approx(s["rewards/scripted"])
    assert abs(s["loss"]) > 1e-3
    assert a["loss"] == pytest.approx(s["loss"], rel=1e-5)  # measured: 2e-7 relative at step 2
    assert a["kl"] == pytest.approx(s["kl"], rel=1e-5, abs=1e-7)
    assert a["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-5)
  # On the shared mesh the PPO ratio is taken against the weights that sampled (one iteration: the
  # current ones), not the initial weights (log ratio ~0.1 at step 2 without the anchor refresh).
  assert agentic[1]["log_ratio/abs_mean"] < 1e-5


FLAKY_TOOL = '''
import random, threading, time
from tunix.rl.agentic.tools import base_tool

_draws, _lock = random.Random(7), threading.Lock()

class Flaky(base_tool.BaseTool):
  """Returns its argument; in 30 % of calls (seeded) it sleeps past the deadline or raises."""

  def get_json_schema(self):
    return {"type": "function", "function": {"name": self.name, "parameters": {"type": "object"}}}

  def apply(self, x):
    with _lock:
      r = _draws.random()
      outcome = "sleep" if r < 0.15 else "crash" if r < 0.3 else "ok"
      with open(LOG, "a") as f:
        f.write(outcome + "\\n")
    if outcome == "sleep":
      time.sleep(10)
    if outcome == "crash":
      raise RuntimeError("flaky tool crashed")
    return base_tool.ToolOutput(name=self.name, output=str(x))

TOOLS = {"flaky": Flaky}
'''


@pytest.mark.slow  # the fast suite counts failed tool calls in test_scripted_tool_calls_are_counted_and_trained
def test_flaky_tool_under_high_concurrency(tmp_path, monkeypatch):
  """rl.max_concurrency=256, off_policy_steps=2, every conversation calls a tool that hangs or
  crashes in 30 % of calls: the run finishes and the failed calls are counted."""
  log = tmp_path / "outcomes.txt"
  (tmp_path / "flaky.py").write_text(f"LOG = {str(log)!r}\n" + FLAKY_TOOL)
  use_script(
    monkeypatch,
    lambda prompt, n: "<answer>1</answer>"
    if "Tool returned result" in prompt
    else '<tool_call>{"name": "flaky", "arguments": {"x": 1}}</tool_call>',
  )
  args = [
    *TINY,
    "num_batches=4",
    "batch_size=2",
    "rl.num_generations=4",
    "max_prompt_length=256",
    "max_response_length=64",
    "rl.use_agentic_rollout=true",
    "rl.max_concurrency=256",
    "rl.off_policy_steps=2",
    "rl.tools=[flaky]",
    f"rl.tools_path={tmp_path / 'flaky.py'}",
    "rl.tool_timeout_s=2",
    "rl.max_turns=2",
    *_reward_file(tmp_path, "[float('<tool_call>' in c) for c in completions]"),
    f"base_output_directory={tmp_path}",
    "run_name=flaky",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  rows = _rows(tmp_path / "flaky" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  assert all(r["tools/call_frequency"] == 1 and r["staleness/max"] <= 2 for r in rows)
  outcomes = log.read_text().split()  # the tool's own record: every call was trained on
  assert sum(r["tools/calls"] for r in rows) == len(outcomes) == 32
  assert sum(r["tools/failed_calls"] for r in rows) == sum(o != "ok" for o in outcomes) > 0


@pytest.mark.slow  # keeps the fast suite in budget; test_pyconfig checks the setting
def test_gradient_accumulation_trains_like_the_whole_batch(tmp_path, monkeypatch):
  """train_micro_batch_size=1 (one prompt's group per micro-batch, gradients accumulated) gives the
  whole batch's loss, gradient norm and parameters."""
  use_script(monkeypatch, lambda prompt, n: ["<answer>72</answer>", "It is 72, I think.", "no idea"][n % 3])
  common = [
    *TINY,
    "num_batches=1",
    "rl.num_generations=3",
    *_reward_file(tmp_path, "[len(c) / 20 for c in completions]"),
    f"base_output_directory={tmp_path}",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *common, "run_name=whole"]) == 0
  assert train_rl.main(["train_rl", "rl.yml", *common, "run_name=micro", "train_micro_batch_size=1"]) == 0
  [whole], [micro] = _rows(tmp_path / "whole" / "metrics.jsonl"), _rows(tmp_path / "micro" / "metrics.jsonl")
  assert whole["grad_norm"] > 0.1  # (the loss itself is ~0 on policy with sequence-mean aggregation)
  for key in ("loss", "rewards/scripted"):  # (grad_norm is logged per micro-batch)
    assert micro[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-6), key
  a = orbax_checkpoint.restore_arrays(str(tmp_path / "whole" / "checkpoints"))
  b = orbax_checkpoint.restore_arrays(str(tmp_path / "micro" / "checkpoints"))
  diffs = {n: float(np.max(np.abs(a[n] - b[n]))) for n in a}
  assert max(diffs.values()) < 1e-5


def test_an_engine_without_log_probs_fails_where_the_sampler_s_are_trained_on(tmp_path, monkeypatch):
  """With rollout_engine=batched the agentic learner trains on the sampler's log-probs; an engine
  that returns none (the script) fails the run instead of training against zeros."""
  use_script(monkeypatch, lambda prompt, n: "<answer>5</answer>")
  args = [
    *TINY,
    "rollout_engine=batched",
    "rl.use_agentic_rollout=true",
    f"base_output_directory={tmp_path}",
    "run_name=no_logps",
  ]
  with pytest.raises(agentic.RolloutError, match="ScriptedRollout returned none"):
    train_rl.main(["train_rl", "rl.yml", *args])
