"""Gradient accumulation that leaves the trained weights alone until a step's last micro-batch.

Tunix accumulates micro-batches with optax.MultiSteps, which on every micro-batch runs the whole
optimizer update and writes a new copy of the trained weights (jnp.where keeps the old values until
the last micro-batch), so each micro-batch's program holds the gradient, the update's
parameter-sized intermediates and the new weights at once. Installed on the actor trainer, a
micro-batch's program only adds its gradient into MultiSteps' own accumulator (the same running mean,
in place: Tunix donates the optimizer state) and the optimizer update runs once per optimizer step,
as a small program of its own, right after the step's last micro-batch (before Tunix counts the step,
checkpoints or syncs the sampler). The optimizer state keeps MultiSteps' layout and values, so
checkpoints, resumption and the trained weights are those of MultiSteps.

cluster.accumulate_in_place installs both on the trainer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from tunix.sft import utils as sft_utils


def compiled_steps(trainer, tx: optax.GradientTransformation):
  """PeftTrainer.jit_train_and_eval_step's contract (the compiled train and eval steps, as the trainer's
  own method gives them) with the optimizer update after each optimizer step's last micro-batch; `tx`
  is the optimizer Tunix wrapped in optax.MultiSteps. The train step compiled is the trainer's
  create_train_step_fn's, which must be `accumulator`."""
  every = trainer.config.gradient_accumulation_steps
  update = nnx.jit(_updater(tx), donate_argnames=("optimizer",), graph_updates=False)
  tunix_jit = trainer.jit_train_and_eval_step

  def jit_train_and_eval_step(skip_jit: bool = False, cache_nnx_graph: bool = False):
    del cache_nnx_graph  # nnx.cached_partial needs graph updates
    with nnx.set_graph_updates(False):  # a program returns the variables it changed, not copies of all
      train_step, eval_step = tunix_jit(skip_jit, False)
    return _ThenUpdate(train_step, trainer, update, every), eval_step

  return jit_train_and_eval_step


def accumulator(trainer):
  """Tunix's train step (loss, gradient) with MultiSteps' accumulation and nothing else. The norm it
  returns is that of the accumulated gradient, the one clipping sees, times the micro-batches per
  update on an update's last micro-batch and 0 on the others: Tunix logs the mean over an update's
  micro-batches, which is then that norm (Tunix's own step logs the mean of the micro-batches'
  norms, which is larger wherever their gradients partly cancel). The loss is called as the GRPO
  learners set it (with_loss_fn(..., has_aux=True)): every policy loss here returns (loss, aux)
  (losses.py)."""
  every = trainer.config.gradient_accumulation_steps

  def accumulate(model, optimizer, inputs):
    inputs = trainer.gen_model_input_fn(inputs)
    argnums = nnx.DiffState(0, nnx.LoRAParam) if sft_utils.is_lora_enabled(model) else 0
    (loss, aux), grads = nnx.value_and_grad(trainer.loss_fn, argnums=argnums, has_aux=True)(model, **inputs)
    grads = nnx.as_pure(nnx.state(grads, optimizer.wrt, graph=optimizer.graph))
    state = nnx.as_pure(optimizer.opt_state)
    count = state.mini_step + 1
    acc = jax.tree.map(lambda a, g: (a + (g - a) / count).astype(a.dtype), state.acc_grads, grads)
    nnx.update(optimizer.opt_state, nnx.state(state._replace(acc_grads=acc, mini_step=count), graph=optimizer.graph))
    optimizer.step[...] += 1
    return loss, aux, jnp.where(count == every, every * optax.global_norm(acc), 0.0)

  return accumulate


def _updater(tx: optax.GradientTransformation):
  """The optimizer update from the accumulated gradient, as MultiSteps makes it on its last
  micro-batch (the accumulator emptied, its counters advanced)."""

  def update(model, optimizer):
    state = nnx.as_pure(optimizer.opt_state)
    params = nnx.as_pure(nnx.state(model, optimizer.wrt, graph=optimizer.graph))
    updates, inner = tx.update(state.acc_grads, state.inner_opt_state, params)
    nnx.update(model, optax.apply_updates(params, updates))
    state = state._replace(
      mini_step=jnp.zeros_like(state.mini_step),
      gradient_step=state.gradient_step + 1,
      inner_opt_state=inner,
      acc_grads=jax.tree.map(jnp.zeros_like, state.acc_grads),
    )
    nnx.update(optimizer.opt_state, nnx.state(state, graph=optimizer.graph))

  return update


class _ThenUpdate:
  """The train step Tunix's loop calls per micro-batch; after a step's last one, the update."""

  def __init__(self, train_step, trainer, update, every: int):
    self.train_step, self.trainer, self.update, self.every = train_step, trainer, update, every

  @property
  def func(self):
    """Tunix's train() reads the jitted function's compile-cache size through this."""
    return self.train_step.func

  def __call__(self, *args):
    out = self.train_step(*args)
    if (self.trainer.iter_steps + 1) % self.every == 0:  # Tunix counts the micro-batch after this returns
      self.update(self.trainer.model, self.trainer.optimizer)
    return out
