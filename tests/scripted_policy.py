"""A scripted policy: a Tunix rollout engine whose completions come from a script instead of a model,
so tests can drive the real learners (trainer, rewards, tools, metrics) with known behaviour.

`script(prompt, n) -> completion text`, where `prompt` is the prompt's text and `n` counts earlier
calls with the same prompt (so the samples of a GRPO group get n = 0, 1, ...). Tokens are the
tokenizer's encoding of the completion plus EOS, cut to the generation budget; prompts come back
left-padded as the learners expect. Token-id prompts (later agentic turns) are decoded for the
script.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable

import numpy as np
from tunix.generate import tokenizer_adapter
from tunix.rl.rollout import base_rollout

from maxtext.integration.tunix import rollout, rollout_setup

Script = Callable[[str, int], str]


class ScriptedRollout(rollout.WithoutExtras, base_rollout.BaseRollout):
  """ClusterConfig.rollout_engine answering from `script` (bind it with functools.partial)."""

  def __init__(self, rollout_actor, tokenizer, mesh, rollout_config, script: Script):
    del mesh, rollout_config
    self._model = rollout_actor
    self._tokenizer = tokenizer_adapter.TokenizerAdapter(tokenizer)
    self._script = script
    self._seen = collections.Counter()
    self._lock = threading.Lock()
    self.calls = 0

  def generate(self, prompts, rollout_config: base_rollout.RolloutConfig, **kwargs):
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    ids = [np.asarray(self._tokenizer.encode(p) if isinstance(p, str) else p, np.int32) for p in prompts]
    texts = [p if isinstance(p, str) else self._tokenizer.decode(i.tolist()) for p, i in zip(prompts, ids)]
    with self._lock:
      ns = []
      for t in texts:
        ns.append(self._seen[t])
        self._seen[t] += 1
      self.calls += len(texts)
    eos = (rollout_config.eos_tokens or [self.eos_id()])[0]
    budget = rollout_config.max_tokens_to_generate
    tokens = [
      np.asarray(self._tokenizer.encode(self._script(t, n)) + [eos], np.int32)[:budget] for t, n in zip(texts, ns)
    ]
    width = max(rollout_config.max_prompt_length, *(len(i) for i in ids))
    padded = np.full((len(ids), width), self.pad_id(), np.int32)
    for row, i in zip(padded, ids):
      row[width - len(i) :] = i
    return base_rollout.RolloutOutput(
      text=[self._tokenizer.decode((t[:-1] if t[-1] == eos else t).tolist()) for t in tokens],
      logits=None,
      tokens=tokens,
      left_padded_prompt_tokens=padded,
      logprobs=None,
    )

  def get_per_token_logps(self, prompt_tokens, completion_tokens):
    raise NotImplementedError("a scripted policy has no log-probs; the trainer computes them")

  def update_params(self, params, filter_types=None) -> None:
    """Nothing to update: the script does not read the weights."""

  def pad_id(self) -> int:
    return self._tokenizer.pad_id()

  def eos_id(self) -> int:
    return self._tokenizer.eos_id()

  def model(self):
    return self._model


def use_script(monkeypatch, script: Script) -> None:
  """Makes train_rl's rollouts come from `script`."""
  monkeypatch.setattr(rollout_setup, "rollout_engine", lambda cfg: functools.partial(ScriptedRollout, script=script))
