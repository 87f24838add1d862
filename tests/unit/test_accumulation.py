"""In-place gradient accumulation on Tunix's trainer (integration/tunix/accumulation.py, installed
by cluster.accumulate_in_place): the weights and optimizer state optax.MultiSteps produces, with the
weights written once per optimizer step instead of once per micro-batch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tunix.sft import hooks, metrics_logger, peft_trainer

from maxtext.integration.tunix import cluster
from maxtext.models import load
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

MICRO, STEPS = 3, 2


def _loss(model, tokens):
  """Next-token cross-entropy, with an aux output as the RL losses have."""
  inputs = tokens[:, :-1]
  length = inputs.shape[1]
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)), (len(inputs), length, length))
  logits = model(inputs, jnp.broadcast_to(jnp.arange(length), inputs.shape), None, causal)[0]
  loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens[:, 1:]).mean()
  return loss, {"loss": loss}


class _Watch(hooks.TrainingHooks):
  """Before each micro-batch: a weight's value and the buffer that holds it."""

  def __init__(self, read):
    self.read, self.seen = read, []

  def on_train_step_start(self, train_ctx):
    weight = self.read(train_ctx.model)
    self.seen.append((np.asarray(weight).copy(), weight.unsafe_buffer_pointer()))

  def on_train_start(self, train_ctx): ...
  def on_train_end(self, train_ctx): ...
  def on_train_step_end(self, train_ctx, train_step, train_loss): ...
  def on_eval_step_start(self, train_ctx): ...
  def on_eval_step_end(self, train_ctx, eval_loss): ...


class _GradNorms:
  """A metrics backend keeping the logged grad_norm of each optimizer step."""

  def __init__(self):
    self.by_step = {}

  def log_scalar(self, event, value, **kwargs):
    if event.endswith("grad_norm"):
      self.by_step[kwargs["step"]] = float(np.asarray(value))

  def close(self): ...


def _train(overrides, in_place: bool, tmp_path):
  cfg = make_config(*overrides)
  mesh = create_meshes(cfg.mesh, agentic=False)[0]
  model = load.load_model(cfg.model, mesh)
  tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2, weight_decay=0.1))
  norms = _GradNorms()
  name = "in_place" if in_place else "multi"
  config = peft_trainer.TrainingConfig(
    eval_every_n_steps=1000,
    max_steps=STEPS,
    gradient_accumulation_steps=MICRO,
    checkpoint_root_directory=str(tmp_path / name),
    metrics_logging_options=metrics_logger.MetricsLoggerOptions(
      log_dir=str(tmp_path / f"{name}_logs"), backend_kwargs={"custom_backend": [lambda *a, **k: norms]}
    ),
  )
  with jax.set_mesh(mesh):
    trainer = peft_trainer.PeftTrainer(model, tx, config).with_loss_fn(_loss, has_aux=True)
  trained = nnx.LoRAParam if cfg.model.lora_rank else nnx.Param  # a weight the optimizer trains
  watch = _Watch(lambda m: jax.tree.leaves(nnx.state(m, trained))[0])
  trainer.with_training_hooks(watch)
  if in_place:
    cluster.accumulate_in_place(trainer, tx)
  rng = np.random.default_rng(0)
  batches = [{"tokens": jnp.asarray(rng.integers(2, 500, (2, 9)), jnp.int32)} for _ in range(MICRO * STEPS)]
  with jax.set_mesh(mesh):
    first_update = _first_update_gradient_norms(load.load_model(cfg.model, mesh), batches[:MICRO], trained)
    trainer.train(batches)
  trainer.close()  # writes the last step's metrics
  return trainer, watch.seen, [v for _, v in sorted(norms.by_step.items())], first_update


def _first_update_gradient_norms(model, batches, trained) -> tuple[float, float]:
  """At the initial weights: the norm of the mean of the micro-batches' gradients (what clipping
  sees) and the mean of their norms."""
  grads = [
    nnx.grad(lambda m, t: _loss(m, t)[0], argnums=nnx.DiffState(0, trained))(model, b["tokens"]) for b in batches
  ]
  mean = jax.tree.map(lambda *g: sum(g) / len(g), *grads)
  return float(optax.global_norm(mean)), float(np.mean([optax.global_norm(g) for g in grads]))


@pytest.mark.parametrize(
  "overrides",
  [
    ("model_name=qwen3-tiny",),
    pytest.param(("model_name=qwen3-tiny", "lora_rank=4", "lora_alpha=8"), marks=pytest.mark.slow),
  ],
)
def test_same_training_as_multisteps_with_one_weight_write_per_step(overrides, tmp_path):
  multi, multi_seen, multi_norms, (accumulated, micro_mean) = _train(overrides, False, tmp_path)
  ours, ours_seen, ours_norms, _ = _train(overrides, True, tmp_path)
  # The logged grad_norm is the norm of the accumulated gradient clipping sees (by hand for the first
  # update); Tunix's MultiSteps step logs the mean of the micro-batches' norms, larger.
  assert len(ours_norms) == STEPS and min(ours_norms) > 0
  np.testing.assert_allclose(ours_norms[0], accumulated, rtol=1e-4)
  np.testing.assert_allclose(multi_norms[0], micro_mean, rtol=1e-4)
  assert accumulated < 0.95 * micro_mean
  assert ours._jitted_train_step_fn is not None  # Tunix jitted our accumulating step
  for a, b in zip(jax.tree.leaves(multi.optimizer.opt_state), jax.tree.leaves(ours.optimizer.opt_state)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  for a, b in zip(jax.tree.leaves(multi.model), jax.tree.leaves(ours.model)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  assert int(ours.optimizer.opt_state.gradient_step[...]) == STEPS and int(ours.optimizer.step[...]) == MICRO * STEPS
  assert not np.asarray(jax.tree.leaves(ours.optimizer.opt_state.acc_grads)[0]).any()
  # The trained weights change once per optimizer step, after its last micro-batch, in both.
  for seen in (multi_seen, ours_seen):
    values = [v for v, _ in seen]
    assert all(np.array_equal(values[0], v) for v in values[:MICRO])
    assert not np.array_equal(values[MICRO - 1], values[MICRO])
  # MultiSteps writes a new copy of the weights every micro-batch; in place, only the update does.
  multi_buffers, ours_buffers = [p for _, p in multi_seen], [p for _, p in ours_seen]
  assert len(set(multi_buffers[:MICRO])) == MICRO
  assert len(set(ours_buffers[:MICRO])) == 1 and ours_buffers[MICRO - 1] != ours_buffers[MICRO]
