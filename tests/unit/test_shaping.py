"""Sample shaping against hand computations (and TRL's soft overlong punishment), and its settings
refused where they would not take effect."""

import numpy as np
import pytest

from maxtext.configs import pyconfig
from maxtext.rl import shaping
from maxtext.utils.errors import ConfigError


def test_overlong_penalty_by_hand():
  # budget 20, buffer 5: no penalty up to 15 tokens, then -1/5 per token, -factor from 20 tokens
  got = shaping.overlong_penalty([10, 15, 16, 18, 20, 25], max_length=20, buffer=5, factor=0.5)
  np.testing.assert_allclose(got, [0.0, 0.0, -0.1, -0.3, -0.5, -0.5], atol=1e-7)


def test_trl_parity_of_the_soft_overlong_punishment():
  rewards = pytest.importorskip("trl.rewards")
  trl_fn = rewards.get_soft_overlong_punishment(max_completion_len=32, soft_punish_cache=8)
  lengths = list(range(0, 40))
  theirs = trl_fn(completion_ids=[[1] * n for n in lengths])
  ours = shaping.overlong_penalty(lengths, max_length=32, buffer=8, factor=1.0)
  np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_truncated_rows_filled_the_budget_without_eos():
  eos, pad = 7, 0
  ids = np.array(
    [
      [3, 4, 5, 6],  # used the budget, no EOS: truncated
      [3, 4, 5, eos],  # ended on the last position: finished
      [3, eos, pad, pad],  # ended early
      [3, 4, pad, pad],  # stopped at a sampled pad token (kept, masked)
    ]
  )
  assert shaping.truncated(ids, ids != pad, eos).tolist() == [True, False, False, False]


def test_sampler_is_weights_by_hand():
  trainer = np.log(np.array([[0.5, 0.2, 0.9]]))
  sampler = np.log(np.array([[0.25, 0.4, 0.9]]))
  weights = shaping.sampler_is_weights(trainer, sampler, threshold=1.5)
  np.testing.assert_allclose(weights, [[1.5, 0.5, 1.0]], rtol=1e-6)  # 2.0 truncated at 1.5


def test_only_the_batched_engine_gives_the_loss_sampler_log_probs():
  cfg = pyconfig.initialize(["x", "rl.yml"])
  assert shaping.Shaping.from_config(cfg.algorithm, cfg.sampling).sampler_logps
  cfg = pyconfig.initialize(["x", "rl.yml", "rollout_engine=vanilla"])
  assert not shaping.Shaping.from_config(cfg.algorithm, cfg.sampling).sampler_logps


@pytest.mark.parametrize(
  "args, message",
  [
    (["rl.use_agentic_rollout=true", "rl.overlong_buffer_length=4"], "rl.overlong_buffer_length=4: agentic GRPO"),
    (["rl.use_agentic_rollout=true", "rl.mask_truncated_completions=true"], "rl.mask_truncated_completions=True"),
    (["rl.dynamic_sampling=true", "rl.dynamic_sampling_max_rounds=1"], "rl.dynamic_sampling_max_rounds=1"),
    (["rl.dynamic_sampling_max_rounds=3"], "rl.dynamic_sampling_max_rounds=3: standard GRPO"),
    (["rl.overlong_buffer_length=100000"], "rl.overlong_buffer_length=100000"),
    (["rl.overlong_penalty=0.5"], "rl.overlong_penalty=0.5: standard GRPO"),
    (["rl.sampler_is=seq"], "rl.sampler_is='seq': expected one of '', token"),
    (["rollout_engine=vanilla", "rl.sampler_is=token"], "rl.sampler_is='token': standard GRPO"),
    (["rl.sampler_is=token", "rl.sampler_is_threshold=0.5"], "rl.sampler_is_threshold=0.5"),
  ],
)
def test_shaping_settings_are_refused_where_they_would_not_take_effect(args, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    pyconfig.initialize(["x", "rl.yml", *args])


def test_reinforce_pp_with_dynamic_sampling_is_refused():
  with pytest.raises(ConfigError, match="rl.dynamic_sampling=true: REINFORCE"):
    pyconfig.initialize(["x", "rl.yml", "rl.advantage_estimator=reinforce_pp", "rl.dynamic_sampling=true"])
