"""PPO's critic from a reward model (critic.load_parameters_path): an HF *ForSequenceClassification
checkpoint that transformers itself writes gives a critic whose value at every position is
transformers' score head on its last hidden state, and whose value at a sequence's last token is the
reward model's score; checkpoints of another kind, shape or head are refused naming the key."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from maxtext.models import load
from maxtext.utils.errors import InputError
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config
from tests.unit.test_hf_parity import write_hf_model
from tests.unit.test_reward_model import write_reward_model


def _write_reward_model(path, shape, seed=1, **changes):
  """A randomly initialised *ForSequenceClassification of one of test_hf_parity's shapes, of the policy's
  vocabulary (256)."""
  return write_reward_model(path, shape, seed, tokenizer=False, vocab_size=256, pad_token_id=0, **changes)


def _config(policy_dir, reward_dir, *overrides):
  return make_config(
    f"load_parameters_path={policy_dir}",
    "rl.algorithm=ppo",
    "rl.num_generations=1",
    f"critic.load_parameters_path={reward_dir}",
    "matmul_precision=highest",
    "weight_dtype=float32",
    "dtype=float32",
    *overrides,
  )


@pytest.mark.parametrize("shape", ["qwen3-mqa-untied", "llama-mha-tied"])
def test_values_equal_transformers_score_head_at_every_position(tmp_path, shape):
  write_hf_model(tmp_path / "policy", shape)
  reward_model = _write_reward_model(tmp_path / "reward", shape)
  cfg = _config(tmp_path / "policy", tmp_path / "reward")
  critic = load.critic_from_reward_model(cfg.critic.load_parameters_path, cfg.model, create_meshes(cfg.mesh, False)[0])
  assert not hasattr(critic.trunk, "lm_head")  # no output layer, tied or not in the policy

  tokens = np.random.default_rng(0).integers(1, 256, (3, 11))
  with torch.no_grad():
    hidden = reward_model.model(torch.tensor(tokens)).last_hidden_state
    theirs = reward_model.score(hidden)[..., 0].numpy()
    pooled = reward_model(torch.tensor(tokens)).logits[:, 0].numpy()  # the score at the last (non-pad) token
  length = tokens.shape[1]
  causal = jnp.tril(jnp.ones((3, length, length), bool))
  positions = jnp.broadcast_to(jnp.arange(length), (3, length))
  ours_hidden, _ = critic.hidden_states(jnp.asarray(tokens), positions, None, causal)
  ours = np.asarray(critic.values(ours_hidden))
  assert ours.dtype == np.float32
  np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ours[:, -1], pooled, rtol=1e-4, atol=1e-4)


def test_a_checkpoint_of_another_kind_shape_or_head_is_refused_naming_the_key(tmp_path):
  shape = "qwen3-mqa-untied"
  write_hf_model(tmp_path / "policy", shape)
  cases = {
    tmp_path / "causal": "config.json's architectures are ['Qwen3ForCausalLM']; expected a *ForSequenceClassification",
    tmp_path
    / "deeper": "a critic of another shape than the policy (policy): num_decoder_layers=3 but config.json has 4",
    tmp_path / "two_labels": "score.weight of shape [2, 64]; expected a head of one output, [1, 64]",
  }
  write_hf_model(tmp_path / "causal", shape)
  _write_reward_model(tmp_path / "deeper", shape, num_hidden_layers=4)
  _write_reward_model(tmp_path / "two_labels", shape, num_labels=2)
  for path, message in cases.items():
    cfg = _config(tmp_path / "policy", path)
    with pytest.raises(InputError) as raised:
      load.critic_from_reward_model(str(path), cfg.model, create_meshes(cfg.mesh, False)[0])
    assert str(raised.value) == f"critic.load_parameters_path={path}: {message}"
