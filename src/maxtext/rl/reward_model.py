"""A learned reward model among the run's rewards (reward_model.*), and the Bradley-Terry objective that
trains one (trainers/post_train/rl/train_reward_model.py).

The reward model reads a prompt and completion as a conversation of its own: the prompt's turns (the
data template's system, example and user turns, or a conversational prompt's own messages) with the
completion as the assistant's reply, rendered through the reward model's own tokenizer and chat
template, as TRL renders a conversation for a reward model, whatever the policy's template is. Where the
prompt is no conversation (a TEMPLATE holding the chat's turn markers is the whole prompt), the text is
the policy's prompt followed by the completion, tokenized by the reward model's tokenizer as it is (no
special tokens added: a reward model whose tokenizer wants its own BOS there gets none). Its score is the
value head at the text's last token.

It runs in the trainer's process on the trainer's mesh, micro_batch_size texts a forward pass, each
batch padded to a multiple of PAD_MULTIPLE tokens (one compiled program per length bucket); every
process scores the whole batch alike, as every process samples it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from maxtext.configs.sections import ModelSection, RewardModelSection
from maxtext.input_pipeline import rewards, templates
from maxtext.input_pipeline.tokenizer import load_tokenizer
from maxtext.models import critic as critic_lib
from maxtext.models import load
from maxtext.tasks.task import RewardFn
from maxtext.utils import distributed, errors
from maxtext.utils import mesh as mesh_lib

NAME = "reward_model"  # its rewards/<name> metrics
PAD_MULTIPLE = 16


class RewardModel:
  """A reward model (a models.critic.Critic: trunk and one-output score head), its tokenizer and the
  run's prompt template, scoring `micro_batch_size` texts a forward pass on `mesh`."""

  def __init__(
    self, model: critic_lib.Critic, tokenizer, template: templates.PromptTemplate, mesh, micro_batch_size: int
  ):
    self.model, self.tokenizer, self._template, self._mesh = model, tokenizer, template, mesh
    self._rows = micro_batch_size

  def conversation(self, fields: Mapping[str, Any]) -> list[dict] | None:
    """The prompt's turns as the policy was given them: a conversational prompt's own messages, or the
    template's turns around the example's question; None where the TEMPLATE is the whole prompt."""
    given = fields.get("prompt")
    if given is not None and rewards.is_conversation(given):
      return [dict(m) for m in given]
    if self._template.turn_markers or "question" not in fields:
      return None
    return self._template.messages(str(fields["question"]))

  def texts(self, prompts: list, completions: list[str], fields: Mapping[str, Any]) -> list[str]:
    """The texts the reward model reads, one per completion (completions as the model wrote them,
    after the prompt's answer prefix; each example's `fields` hold one value per completion): the
    conversation as its chat template writes it, or (no conversation) the prompt and completion as
    plain text ending in the EOS token, as TRL's RewardTrainer appends it to non-conversational data."""
    return [text for text, _ in self._texts(prompts, completions, fields)]

  def token_ids(self, prompts: list, completions: list[str], fields: Mapping[str, Any]) -> list[list[int]]:
    """The token ids the reward model scores, as TRL's RewardTrainer tokenizes what it trains on: a
    conversation's text without special tokens added (its template writes them), plain text with
    them (the tokenizer's BOS, where it adds one)."""
    texts = self._texts(prompts, completions, fields)
    return [self.tokenizer(text, add_special_tokens=plain)["input_ids"] for text, plain in texts]

  def _texts(self, prompts: list, completions: list[str], fields: Mapping[str, Any]) -> list[tuple[str, bool]]:
    prefix, eos = self._template.answer_prefix, self.tokenizer.eos_token or ""
    out = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
      turns = self.conversation({k: v[i] for k, v in fields.items() if _per_completion(v, len(prompts))})
      if turns is None:
        text = str(prompt)
        text = (text[: len(text) - len(prefix)] if prefix and text.endswith(prefix) else text) + completion
        out.append((text if text.endswith(eos) else text + eos, True))
      else:
        reply = [{"role": "assistant", "content": completion}]
        out.append((self.tokenizer.apply_chat_template(turns + reply, tokenize=False), False))
    return out

  def scores(self, ids: list[list[int]]) -> np.ndarray:
    """float32 scores [len(ids)] of token id lists (token_ids')."""
    graphdef, state = nnx.split(self.model)
    out = []
    with self._mesh:  # as the critic scores: every process places its rows of the same batch
      for start in range(0, len(ids), self._rows):
        tokens, lengths = padded(ids[start : start + self._rows], self._rows, self.tokenizer.pad_token_id)
        tokens, lengths = mesh_lib.global_batch((tokens, lengths), self._mesh)
        values = distributed.host_array(_scores(graphdef, state, tokens, lengths))
        out.append(values[: min(self._rows, len(ids) - start)])
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)

  def reward_function(self) -> RewardFn:
    """The reward model as a reward function of the run (rewards/reward_model), its output checked as
    every reward function's is (rewards.checked)."""
    score = lambda prompts, completions, fields: self.scores(self.token_ids(prompts, completions, fields))
    return rewards.checked(NAME, score, self._template.answer_prefix)


def _per_completion(value: Any, n: int) -> bool:
  return hasattr(value, "__len__") and not isinstance(value, str) and len(value) == n


def padded(ids: list[list[int]], rows: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [rows, T], lengths [rows]): the token lists right-padded to T, a multiple of PAD_MULTIPLE,
  with rows beyond them copies of the first (their scores are not used)."""
  if any(len(x) == 0 for x in ids):
    raise ValueError("a text of no tokens has no last token to score")
  ids = list(ids) + [ids[0]] * (rows - len(ids))
  width = -(-max(len(x) for x in ids) // PAD_MULTIPLE) * PAD_MULTIPLE
  tokens = np.full((rows, width), pad, np.int32)
  for r, x in enumerate(ids):
    tokens[r, : len(x)] = x
  return tokens, np.array([len(x) for x in ids], np.int32)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _scores(graphdef, state, tokens, lengths):
  return critic_lib.last_token_scores(nnx.merge(graphdef, state), tokens, lengths)


def load_reward_model(
  section: RewardModelSection, policy: ModelSection, template: templates.PromptTemplate, mesh
) -> RewardModel:
  """reward_model.load_parameters_path's model (load.reward_model) and the tokenizer beside it, on `mesh`."""
  path = section.load_parameters_path
  model = load.reward_model(path, policy, mesh)
  try:
    tokenizer = load_tokenizer(path)
  except errors.InputError as e:
    raise type(e)(f"reward_model.load_parameters_path={path}: its tokenizer: {e}") from e
  if len(tokenizer) > model.config.vocab_size:
    raise errors.InputError(
      f"reward_model.load_parameters_path={path}: its tokenizer's {len(tokenizer)} tokens exceed its "
      f"vocab_size={model.config.vocab_size}"
    )
  return RewardModel(model, tokenizer, template, mesh, section.micro_batch_size)


def bradley_terry_loss(chosen: jax.Array, rejected: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(the mean of -log sigmoid(chosen - rejected), the share of pairs where chosen scores higher): the
  Bradley-Terry objective of a reward model over preference pairs' scores [N]."""
  margin = chosen - rejected
  return -jnp.mean(jax.nn.log_sigmoid(margin)), jnp.mean((margin > 0).astype(jnp.float32))
