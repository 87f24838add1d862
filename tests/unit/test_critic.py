"""PPO's critic (models/critic.py, integration/tunix/critic.py): its values are a float32 head on the
decoder's hidden states at the positions before each completion token, whatever the padding; its
updates fit the returns (in mini-batches, clipped around the old values); with LoRA its head and
adapters train and the base it shares with the policy does not; and it is saved and restored with
the actor's checkpoints."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from maxtext.integration.tunix import cluster, scoring
from maxtext.integration.tunix import ppo as ppo_learner
from maxtext.integration.tunix.critic import CriticTrainer, learning_rate, schedule
from maxtext.models import critic as critic_lib
from maxtext.models import load
from maxtext.rl import ppo
from maxtext.utils.errors import InputError
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

PAD, EOS = 0, 1


def _policy(*overrides):
  cfg = make_config("model_name=qwen3-tiny", "rl.algorithm=ppo", "rl.num_generations=1", *overrides)
  mesh = create_meshes(cfg.mesh, agentic=False)[0]
  return cfg, mesh, load.load_model(cfg.model, mesh)


def _batch(rows=8, prompt=10, completion=6, seed=0):
  """Left-padded prompts, right-padded completions (row 0: 4 pad tokens first; row 1: 3 live tokens)."""
  rng = np.random.default_rng(seed)
  prompt_ids = rng.integers(2, 500, (rows, prompt))
  prompt_ids[0, :4] = PAD
  completion_ids = rng.integers(2, 500, (rows, completion))
  completion_ids[1, 3:] = PAD
  return jnp.asarray(prompt_ids, jnp.int32), jnp.asarray(completion_ids, jnp.int32), jnp.asarray(completion_ids != PAD)


def test_values_are_a_float32_head_on_the_hidden_state_before_each_completion_token():
  """Against the decoder run alone on each row's unpadded tokens, with positions from 0."""
  _, _, policy = _policy("weight_dtype=float32", "dtype=float32")
  critic = critic_lib.from_policy(policy, seed=1)
  critic.score[...] = jnp.asarray(np.random.default_rng(3).normal(size=(policy.config.emb_dim, 1)), jnp.float32)
  prompt_ids, completion_ids, mask = _batch()
  values = np.asarray(scoring.completion_values(critic, prompt_ids, completion_ids, PAD, EOS))
  score = np.asarray(critic.score[...], np.float64)
  for row in range(len(prompt_ids)):
    prompt = [t for t in np.asarray(prompt_ids[row]) if t != PAD]
    tokens = jnp.asarray([prompt + list(np.asarray(completion_ids[row]))], jnp.int32)
    length = tokens.shape[1]
    causal = jnp.tril(jnp.ones((1, length, length), bool))
    hidden, _ = policy.hidden_states(tokens, jnp.arange(length)[None], None, causal)
    before_each = np.asarray(hidden[0, len(prompt) - 1 : -1], np.float64)  # the state before completion token t
    live = np.asarray(mask[row])
    np.testing.assert_allclose(values[row][live], (before_each @ score)[:, 0][live], rtol=2e-4, atol=2e-4)


def test_groups_sharing_a_prompt_score_it_once_for_the_same_values_and_gradients():
  """rl.num_generations > 1: SharedPrefixCritic gives the values and gradients of whole sequences."""
  cfg, mesh, policy = _policy("weight_dtype=float32", "dtype=float32", "learning_rate=1e-3")
  prompt_ids, completion_ids, mask = _batch(rows=4)
  prompt_ids, completion_ids, mask = (jnp.repeat(a, 2, axis=0) for a in (prompt_ids, completion_ids, mask))
  completion_ids = completion_ids.at[1, 2:].set(PAD)  # a group's samples differ
  mask = completion_ids != PAD
  returns = _returns(mask)
  params = []
  for group in (1, 2):
    trainer = CriticTrainer(critic_lib.from_policy(policy, 1), cfg.critic, cfg.train, mesh, PAD, EOS, None, 1, group)
    trainer.critic.score[...] = jnp.full((policy.config.emb_dim, 1), 0.01, jnp.float32)
    old = trainer.values(prompt_ids, completion_ids)
    metrics = trainer.train(prompt_ids, completion_ids, mask, old, returns)
    params.append((old, metrics, trainer.items(), trainer.values(prompt_ids, completion_ids)))
  live = np.asarray(mask)
  np.testing.assert_allclose(params[0][0][live], params[1][0][live], rtol=1e-4, atol=1e-5)
  assert params[0][1]["critic/value_loss"] == pytest.approx(params[1][1]["critic/value_loss"], rel=1e-4)
  np.testing.assert_allclose(params[0][3][live], params[1][3][live], rtol=1e-4, atol=1e-5)  # after the update
  # After one AdamW step (lr 1e-3: each weight moves by about lr * g / (|g| + eps)) the weights agree to a
  # tenth of lr, but for a few whose gradient is near 0, where that ratio magnifies float differences.
  for a, b in zip(jax.tree.leaves(params[0][2]), jax.tree.leaves(params[1][2]), strict=True):
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    assert diff.max() <= 3e-4 and (diff > 1e-4).mean() <= 1e-3


def test_the_head_and_values_stay_float32_under_a_bfloat16_policy():
  cfg, _, policy = _policy("weight_dtype=bfloat16", "dtype=bfloat16")
  critic = critic_lib.from_policy(policy, seed=1)
  prompt_ids, completion_ids, _ = _batch()
  assert critic.score[...].dtype == jnp.float32 and critic.trunk.embed[...].dtype == jnp.bfloat16
  assert scoring.completion_values(critic, prompt_ids, completion_ids, PAD, EOS).dtype == jnp.float32
  assert learning_rate(cfg.critic, cfg.train) == pytest.approx(10 * cfg.train.learning_rate)


def _fit(trainer, batch, returns, updates):
  prompt_ids, completion_ids, mask = batch
  metrics = []
  for _ in range(updates):
    old = trainer.values(prompt_ids, completion_ids)
    metrics.append(trainer.train(prompt_ids, completion_ids, mask, old, returns))
  return metrics


def _returns(mask, seed=5):
  return jnp.where(mask, jnp.asarray(np.random.default_rng(seed).normal(size=mask.shape), jnp.float32), 0.0)


def test_updates_fit_the_returns():
  cfg, mesh, policy = _policy("learning_rate=1e-4", "adam_weight_decay=0")
  trainer = CriticTrainer(critic_lib.from_policy(policy, 1), cfg.critic, cfg.train, mesh, PAD, EOS, rows=None)
  batch = _batch()
  metrics = _fit(trainer, batch, _returns(batch[2]), 15)
  assert metrics[0]["critic/explained_variance"] == pytest.approx(0.0, abs=1e-6)  # the head starts at zero
  assert metrics[-1]["critic/value_loss"] < 0.3 * metrics[0]["critic/value_loss"]
  assert metrics[-1]["critic/explained_variance"] > 0.5
  assert all(m["critic/vf_clipfrac"] == 0.0 for m in metrics)  # one update a step: never away from the old values


def test_mini_batches_are_updates_in_turn_and_clipping_holds_values_near_the_old_ones():
  """rows=2 of 8: four updates a step; from the second on the values have moved, and with a small
  clip range the loss stops pulling the ones that left it (vf_clipfrac > 0): they end nearer the
  old values than without clipping (measured: 1.04 against 1.42 at most; AdamW's momentum still moves
  them)."""
  batch, moved, fractions = _batch(), {}, {}
  for clip in (0.0, 0.01):
    cfg, mesh, policy = _policy("learning_rate=1e-3", "adam_weight_decay=0", f"critic.clip_range_value={clip}")
    trainer = CriticTrainer(critic_lib.from_policy(policy, 1), cfg.critic, cfg.train, mesh, PAD, EOS, rows=2)
    prompt_ids, completion_ids, mask = batch
    old = trainer.values(prompt_ids, completion_ids)
    metrics = trainer.train(prompt_ids, completion_ids, mask, old, _returns(mask) + 5.0)
    new = trainer.values(prompt_ids, completion_ids)
    moved[clip] = float(jnp.max(jnp.abs(jnp.where(mask, new - old, 0.0))))
    fractions[clip] = metrics["critic/vf_clipfrac"]
  assert fractions[0.0] == 0.0 and fractions[0.01] > 0.2
  assert moved[0.01] < 0.85 * moved[0.0]


def test_the_critics_learning_rate_follows_critic_lr_schedule_over_its_updates(monkeypatch):
  """constant: critic.learning_rate at every update; warmup_cosine: from 0 over warmup_steps_fraction of the
  critic's updates, then a cosine decay to 0 (values written here), so the first update moves nothing. The
  learner gives the schedule the run's critic updates: num_batches x rl.num_iterations x the step's
  completions over critic.mini_batch_size."""
  cfg, mesh, policy = _policy("learning_rate=1e-4", "critic.lr_schedule=warmup_cosine", "warmup_steps_fraction=0.5")
  rates = schedule(cfg.critic, cfg.train, 4)
  assert [float(rates(i)) for i in range(4)] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4])
  constant = _policy("learning_rate=1e-4")[0]
  assert schedule(constant.critic, constant.train, 4) == pytest.approx(1e-3)

  batch = _batch()
  moved = {}
  for name, run in (("warmup_cosine", cfg), ("constant", constant)):
    trainer = CriticTrainer(critic_lib.from_policy(policy, 1), run.critic, run.train, mesh, PAD, EOS, None, updates=4)
    before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(trainer.critic, nnx.Param))]
    moved[name] = []
    for _ in range(2):
      _fit(trainer, batch, _returns(batch[2]), 1)
      after = [np.asarray(x) for x in jax.tree.leaves(nnx.state(trainer.critic, nnx.Param))]
      moved[name].append(max(float(np.abs(a - b).max()) for a, b in zip(after, before, strict=True)))
      before = after
  assert moved["warmup_cosine"][0] == 0.0 and moved["warmup_cosine"][1] > 0.0
  assert moved["constant"][0] > 0.0

  built = make_config(
    "rl.algorithm=ppo", "batch_size=2", "rl.num_generations=4", "critic.mini_batch_size=4", "rl.num_iterations=2"
  )
  monkeypatch.setattr(ppo_learner, "PPOLearner", lambda **kwargs: kwargs)
  monkeypatch.setattr(ppo_learner, "CriticTrainer", lambda *args, **kwargs: kwargs)
  cluster_ = types.SimpleNamespace(rollout=types.SimpleNamespace(pad_id=lambda: 0, eos_id=lambda: 1))
  kwargs = ppo_learner.build_learner(
    built.train, built.algorithm, built.critic, built.sampling, cluster_, [], None, None
  )
  assert kwargs["critic"]["updates"] == built.train.num_batches * 2 * (8 // 4)


def test_an_untied_output_layer_is_neither_trained_nor_saved_with_the_critic():
  """No value reads lm_head: the critic's AdamW holds no moments of it, leaves it as it was (weight
  decay included) and its checkpoint items lack it; the rest of the trunk trains."""
  cfg, mesh, policy = _policy("logits_via_embedding=false", "learning_rate=1e-3", "adam_weight_decay=0.1")
  trainer = CriticTrainer(critic_lib.from_policy(policy, 1), cfg.critic, cfg.train, mesh, PAD, EOS, rows=None)
  head, embed = np.asarray(trainer.critic.trunk.lm_head[...]), np.asarray(trainer.critic.trunk.embed[...])
  batch = _batch()
  _fit(trainer, batch, _returns(batch[2]), 2)
  np.testing.assert_array_equal(np.asarray(trainer.critic.trunk.lm_head[...]), head)
  assert not np.array_equal(np.asarray(trainer.critic.trunk.embed[...]), embed)
  for item in trainer.items().values():
    paths = ["/".join(map(str, path)) for path, _ in nnx.to_flat_state(item)]
    assert paths and not [p for p in paths if "lm_head" in p]


def test_mini_batches_of_the_whole_batch_are_one_update():
  """rows equal to the batch and rows=None make the same single update."""
  batch = _batch()
  params = []
  for rows in (None, 8):
    cfg, mesh, policy = _policy("learning_rate=1e-3")
    trainer = CriticTrainer(critic_lib.from_policy(policy, 1), cfg.critic, cfg.train, mesh, PAD, EOS, rows=rows)
    _fit(trainer, batch, _returns(batch[2]), 1)
    params.append(jax.tree.leaves(nnx.state(trainer.critic, nnx.Param)))
  for a, b in zip(*params, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_lora_critic_trains_its_head_and_adapters_and_leaves_the_base_it_shares_with_the_policy():
  cfg, mesh, policy = _policy("lora_rank=4", "lora_alpha=8", "learning_rate=1e-3")
  critic = critic_lib.from_policy(policy, seed=7)
  base_before = {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(nnx.state(critic.trunk, nnx.Not(nnx.LoRAParam)))}
  adapters_before = {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(nnx.state(critic.trunk, nnx.LoRAParam))}
  policy_adapters = {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(nnx.state(policy, nnx.LoRAParam))}
  trainer = CriticTrainer(critic, cfg.critic, cfg.train, mesh, PAD, EOS, rows=None)
  batch = _batch()
  _fit(trainer, batch, _returns(batch[2]), 3)
  assert np.abs(np.asarray(critic.score[...])).max() > 0  # the head trained
  after = dict(nnx.to_flat_state(nnx.state(critic.trunk, nnx.LoRAParam)))
  assert any(not np.array_equal(adapters_before[k], np.asarray(after[k][...])) for k in adapters_before)
  for k, v in nnx.to_flat_state(nnx.state(critic.trunk, nnx.Not(nnx.LoRAParam))):
    np.testing.assert_array_equal(base_before[k], np.asarray(v[...]))
  for k, v in nnx.to_flat_state(nnx.state(policy, nnx.LoRAParam)):  # the policy's adapters are its own
    np.testing.assert_array_equal(policy_adapters[k], np.asarray(v[...]))


def test_the_critic_is_saved_in_the_actors_checkpoints_and_restored_from_them(tmp_path):
  cfg, mesh, policy = _policy("learning_rate=1e-3")
  trainer = CriticTrainer(critic_lib.from_policy(policy, 1), cfg.critic, cfg.train, mesh, PAD, EOS, rows=None)
  batch = _batch()
  _fit(trainer, batch, _returns(batch[2]), 2)
  saved = jax.tree.map(np.asarray, trainer.items())
  options = ocp.CheckpointManagerOptions(max_to_keep=None)
  manager = cluster.CheckpointManager(str(tmp_path / "actor"), options)
  manager.with_items(trainer.items)
  optimizer = nnx.Optimizer(policy, cluster.adamw(cfg.train, 1e-3), wrt=nnx.Param)
  assert manager.save(2, policy, optimizer, force=True)
  manager.save(3, policy, optimizer, force=True)
  manager.close()

  _fit(trainer, batch, _returns(batch[2]), 1)  # moves on from what was saved
  other = cluster.CheckpointManager(str(tmp_path / "actor"), options)
  trainer.restore(other.restore_items(2, trainer.items()))
  for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(trainer.items()), strict=True):
    np.testing.assert_array_equal(a, np.asarray(b))

  plain = cluster.CheckpointManager(str(tmp_path / "grpo"), options)  # a GRPO run's: no critic
  plain.save(1, policy, optimizer, force=True)
  plain.close()
  with pytest.raises(InputError, match=r"grpo/1: holds no critic_params, critic_optimizer_state"):
    cluster.CheckpointManager(str(tmp_path / "grpo"), options).restore_items(1, trainer.items())


def test_explained_variance_is_logged_from_the_values_the_batch_was_scored_with():
  cfg, mesh, policy = _policy()
  trainer = CriticTrainer(critic_lib.from_policy(policy, 1), cfg.critic, cfg.train, mesh, PAD, EOS, rows=None)
  prompt_ids, completion_ids, mask = _batch()
  old = trainer.values(prompt_ids, completion_ids)
  returns = old + jnp.where(mask, 0.5, 0.0)
  metrics = trainer.train(prompt_ids, completion_ids, mask, old, returns)
  expected = float(ppo.explained_variance(old, returns, mask))
  assert metrics["critic/explained_variance"] == pytest.approx(expected)
  live = np.asarray(mask)
  assert metrics["critic/returns_mean"] == pytest.approx(float(np.asarray(returns)[live].mean()), rel=1e-5)


@pytest.mark.parametrize("micro", ["train_micro_batch_size=0", "train_micro_batch_size=1"])
def test_a_ppo_step_reaches_the_learner_whole_so_its_critic_phase_sees_the_step_s_batch(micro, tmp_path):
  """PPO whitens its advantages over the step's batch and updates its critic on all of it: Tunix's
  training config hands the learner the whole step in one call whatever the training micro-batch (the
  sampler's own chunks, rollout_max_batch_size, are inside that call), and the learner refuses a
  config that would hand it a step in parts (GRPO's may: its advantages are per group)."""
  from maxtext.integration.tunix import metrics

  args = ("rl.algorithm=ppo", "rl.num_generations=1", "batch_size=4", micro)
  sinks = metrics.MetricSinks(str(tmp_path))
  for algorithm in (args, ("batch_size=4", "rl.num_generations=2", micro)):
    cfg = make_config(*algorithm)
    training = cluster.training_config(cfg.run, cfg.train, cfg.algorithm, sinks, str(tmp_path / "ckpt"))
    whole = training.rollout_micro_batch_size == training.mini_batch_size == 4
    assert whole if cfg.algorithm.algorithm == "ppo" else training.rollout_micro_batch_size is None
  parts = types.SimpleNamespace(rollout_micro_batch_size=1, mini_batch_size=4)
  rl_cluster = types.SimpleNamespace(cluster_config=types.SimpleNamespace(training_config=parts))
  with pytest.raises(RuntimeError, match=r"whole step \(4 prompts\) in one call, not rollout_micro_batch_size=1"):
    ppo_learner.PPOLearner(rl_cluster=rl_cluster, critic=None, warmup_steps=0)
