"""Trains a reward model by Bradley-Terry on preference pairs of the policy's own samples and writes it
as an HF *ForSequenceClassification checkpoint, which reward_model.load_parameters_path (and
critic.load_parameters_path) read:

    python -m maxtext.trainers.post_train.rl.train_reward_model rl_times_table.yml \\
        reward_training.output_path=DIR [key=value ...]

1. The run's model (model_name, load_parameters_path) samples reward_training.samples_per_prompt
   completions of each of reward_training.num_prompts training questions (shuffled by
   data_shuffle_seed), with the run's template and sampling settings.
2. The run's rule rewards (the task's, or reward_functions') score them. Every two completions of a
   question whose rewards differ make a pair, the higher chosen; at most max_pairs_per_prompt a question.
3. The pairs of held_out_fraction of the questions are held out. The reward model, the policy's
   weights with a score head at zero, trains num_steps AdamW updates of pairs_per_step pairs on the
   others under -log sigmoid(score(chosen) - score(rejected)), each text the conversation as
   rl/reward_model.py renders it for scoring.
4. It is written with the policy's tokenizer. The last stdout line is a JSON summary: the pairs, the
   held-out pair accuracy before and after (ties count half), the first update's loss and the mean loss
   of the last tenth of the updates; the log ends with the peak memory.
"""

from __future__ import annotations

import itertools
import logging
import sys

import jax
import numpy as np
from flax import nnx

from maxtext.configs import cli
from maxtext.configs.run_config import RunConfig
from maxtext.utils.errors import InputError

log = logging.getLogger(__name__)


def preference_pairs(totals: np.ndarray, group: int, most: int, rng: np.random.Generator) -> list[tuple[int, int]]:
  """(chosen, rejected) indices of completions in groups of `group` (one question's each): every two of a
  group whose `totals` differ, the higher chosen; at most `most` a group, drawn with `rng`."""
  pairs: list[tuple[int, int]] = []
  for start in range(0, len(totals), group):
    mine = [
      (i, j) if totals[i] > totals[j] else (j, i)
      for i, j in itertools.combinations(range(start, start + group), 2)
      if totals[i] != totals[j]
    ]
    picked = rng.permutation(len(mine))[:most]
    pairs.extend(mine[k] for k in sorted(picked))
  return pairs


def pair_accuracy(scores: np.ndarray, pairs: list[tuple[int, int]]) -> float | None:
  """The share of pairs whose chosen text scores higher (a tie counts half); None without pairs."""
  if not pairs:
    return None
  c, r = np.array([scores[i] for i, _ in pairs]), np.array([scores[j] for _, j in pairs])
  return float(np.mean((c > r) + 0.5 * (c == r)))


@nnx.jit(static_argnames=("trained",))
def _update(optimizer, model, tokens, lengths, trained):
  """One AdamW update of the `trained` parameters on the Bradley-Terry loss of a batch whose first half
  are the chosen texts and second half the rejected; returns (loss, pair accuracy)."""
  from maxtext.models.critic import last_token_scores
  from maxtext.rl.reward_model import bradley_terry_loss

  def loss_fn(m):
    scores = last_token_scores(m, tokens, lengths)
    half = scores.shape[0] // 2
    return bradley_terry_loss(scores[:half], scores[half:])

  (loss, accuracy), grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, trained), has_aux=True)(model)
  optimizer.update(model, grads)
  return loss, accuracy


def train_reward_model(cfg: RunConfig) -> list[dict]:
  """The command's work (the module's steps 1-4) on a checked config; returns its summary row."""
  # Heavy imports after config validation, so config errors come back at once.
  from maxtext import tasks
  from maxtext.checkpoint_conversion import to_huggingface
  from maxtext.input_pipeline import datasets, rewards, templates
  from maxtext.input_pipeline.tokenizer import tokenizer_for
  from maxtext.integration.tunix import cluster, rollout_setup
  from maxtext.models import critic as critic_lib
  from maxtext.models.load import load_model
  from maxtext.rl import reward_model
  from maxtext.trainers.post_train.rl import footprint
  from maxtext.utils import columns, distributed
  from maxtext.utils import mesh as mesh_lib

  cfg.check(distributed.initialize(), program="train_reward_model")
  section = cfg.reward_training
  if cfg.model.lora_rank:
    raise InputError(f"lora_rank={cfg.model.lora_rank}: train_reward_model trains every weight; expected 0")
  task = tasks.select(cfg.data.dataset_name)
  reward_set = rewards.reward_functions(task, cfg.task, cfg.maxtext_view())
  mesh, _ = mesh_lib.create_meshes(cfg.mesh, agentic=False)
  tokenizer = tokenizer_for(cfg.model)
  template = templates.PromptTemplate(cfg.task, tokenizer, task.template)
  source = datasets.Examples(cfg.data, template, cfg.sampling.max_prompt_length, cfg.maxtext_view())
  training = source.training()
  reward_set.check_fields(training[0])
  rng = np.random.default_rng(cfg.data.data_shuffle_seed)
  questions = [training[i] for i in rng.permutation(len(training))[: section.num_prompts]]

  group = section.samples_per_prompt
  rows = [ex for ex in questions for _ in range(group)]
  prompts = [ex["prompts"] for ex in rows]
  policy = load_model(cfg.model, mesh)
  config = rollout_setup.rollout_configs(cfg.sampling, cfg.eval.eval_sampling_strategy, False, tokenizer.eos_token_id)
  engine = rollout_setup.rollout_engine(cfg.sampling)(policy, tokenizer, mesh, config[rollout_setup.Mode.TRAIN])
  chunk = group * max(1, cfg.sampling.rollout_max_batch_size // group)
  completions: list[str] = []
  for start in range(0, len(prompts), chunk):
    completions += engine.generate(prompts[start : start + chunk], config[rollout_setup.Mode.TRAIN]).text
    log.info("Sampled %d of %d completions", len(completions), len(prompts))
  batcher = getattr(engine, "batcher", None)  # the batched engine's scheduler thread holds its KV cache
  if batcher is not None:
    batcher.close()
  del engine, batcher
  fields = {k: columns.as_array([ex[k] for ex in rows]) for k in rows[0] if k != "prompts"}
  try:
    totals, _ = reward_set.score(prompts, completions, fields, group)
  except rewards.NonFiniteReward as e:
    raise InputError(f"train_reward_model: the reward functions' {e}; expected finite rewards to rank by") from None

  pairs = preference_pairs(totals, group, section.max_pairs_per_prompt, rng)
  held_out_questions = int(round(section.held_out_fraction * len(questions)))
  held = [p for p in pairs if p[0] // group < held_out_questions]
  train = [p for p in pairs if p[0] // group >= held_out_questions]
  if not train:
    raise InputError(
      f"reward_training.num_prompts={section.num_prompts}: the rule rewards gave no training question two "
      "completions of different reward; expected more questions or samples_per_prompt"
    )
  log.info("%d preference pairs: %d to train on, %d held out", len(pairs), len(train), len(held))
  for c, r in train[:3]:
    log.info(
      "A pair of %r: chosen %r (%g), rejected %r (%g)",
      rows[c]["question"],
      completions[c],
      totals[c],
      completions[r],
      totals[r],
    )

  model = critic_lib.Critic(policy)  # the policy's weights as the trunk, the score head at zero
  scorer = reward_model.RewardModel(model, tokenizer, template, mesh, section.micro_batch_size)
  ids = scorer.token_ids(prompts, [template.answer_prefix + c for c in completions], fields)
  held_texts = sorted({i for p in held for i in p})

  def held_accuracy() -> float | None:
    scores = np.zeros(len(ids), np.float32)
    scores[held_texts] = scorer.scores([ids[i] for i in held_texts])
    return pair_accuracy(scores, held)

  before = held_accuracy() if held else None
  with jax.set_mesh(mesh):
    trained = critic_lib.trained(model)
    optimizer = nnx.Optimizer(model, cluster.adamw(cfg.train, section.learning_rate), wrt=trained)
  losses = []
  with mesh:
    for step in range(section.num_steps):
      batch = [
        train[k] for k in rng.choice(len(train), section.pairs_per_step, replace=len(train) < section.pairs_per_step)
      ]
      order = [c for c, _ in batch] + [r for _, r in batch]
      tokens, lengths = reward_model.padded([ids[i] for i in order], len(order), tokenizer.pad_token_id)
      tokens, lengths = mesh_lib.global_batch((tokens, lengths), mesh)
      loss, accuracy = _update(optimizer, model, tokens, lengths, trained)  # type: ignore[call-arg]
      losses.append(float(loss))
      log.info("step %d/%d: loss %.4f, pair accuracy %.3f", step + 1, section.num_steps, losses[-1], float(accuracy))
  after = held_accuracy() if held else None
  to_huggingface.export(policy, cfg.model, tokenizer, section.output_path, score=model.score[...])
  log.info("Wrote the reward model to %s", section.output_path)
  log.info("Peak memory (RSS) %.2f GB", footprint.peak_rss_bytes() / footprint.GB)
  return [
    {
      "reward_model": section.output_path,
      "completions": len(completions),
      "pairs": len(pairs),
      "train_pairs": len(train),
      "held_out_pairs": len(held),
      "held_out_accuracy_before": before,
      "held_out_accuracy_after": after,
      "first_loss": losses[0],
      "last_loss": float(np.mean(losses[-max(1, len(losses) // 10) :])),
      "mean_rule_reward": float(np.mean(totals)),
    }
  ]


def main(argv: list[str]) -> int:
  return cli.main(argv, train_reward_model)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
