"""Our rollout engine fixes google-tunix 0.1.7 sampler defects; each test fails on the vanilla one."""

import dataclasses

import numpy as np
import pytest
from tunix.rl.rollout import base_rollout, vanilla_rollout

from maxtext.checkpoint_conversion import load
from maxtext.integration.tunix.rollout import RolloutEngine
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

PROMPTS = ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"] * 2


@pytest.fixture(scope="module")
def setup(qwen3_tokenizer):
  cfg = make_config("model_name=qwen3-tiny", "max_prompt_length=16", "max_response_length=8")
  mesh, _ = create_meshes(cfg)
  model = load.load_model(cfg, mesh)
  config = base_rollout.RolloutConfig(
      max_tokens_to_generate=8, max_prompt_length=16, kv_cache_size=24, temperature=1.0, top_p=1.0,
      top_k=None, eos_tokens=[qwen3_tokenizer.eos_token_id],
  )
  engine = RolloutEngine(model, qwen3_tokenizer, mesh, config, seed=0)
  vanilla = vanilla_rollout.VanillaRollout(model, qwen3_tokenizer, base_rollout.CacheConfig(24, 2, 2, 32))
  return engine, vanilla, config


def _tokens(out):
  return [t.tolist() for t in out.tokens]


def test_each_call_samples_fresh_tokens(setup):
  engine, vanilla, config = setup
  assert _tokens(vanilla.generate(PROMPTS, config)) == _tokens(vanilla.generate(PROMPTS, config))  # the defect
  first, second = _tokens(engine.generate(PROMPTS, config)), _tokens(engine.generate(PROMPTS, config))
  assert first != second


def test_explicit_seed_is_reproducible(setup):
  engine, _, config = setup
  seeded = dataclasses.replace(config, seed=123)
  assert _tokens(engine.generate(PROMPTS, seeded)) == _tokens(engine.generate(PROMPTS, seeded))


def test_completion_that_stops_keeps_its_eos(setup):
  engine, vanilla, config = setup
  greedy = dataclasses.replace(config, temperature=0.0, top_p=None)
  first_token = int(vanilla.generate(PROMPTS[:1], greedy).tokens[0][0])
  # Make the model's first greedy token the EOS: generation stops right away.
  stop_now = dataclasses.replace(greedy, eos_tokens=[first_token])
  assert _tokens(vanilla.generate(PROMPTS[:1], stop_now)) == [[]]  # the defect: EOS dropped
  assert _tokens(engine.generate(PROMPTS[:1], stop_now)) == [[first_token]]


def test_completion_at_budget_gets_no_extra_token(setup):
  engine, _, config = setup
  never = dataclasses.replace(config, eos_tokens=[151642])  # a token the tiny model does not emit here
  out = engine.generate(PROMPTS, never)
  assert [len(t) for t in out.tokens] == [8, 8]
  assert all(t.dtype == np.int32 for t in out.tokens)


def test_later_turn_prompt_longer_than_max_prompt_length_uses_the_cache_room(setup, qwen3_tokenizer):
  """A second-turn prompt of 20 tokens with 4 to generate fits the 24-token cache; the vanilla sampler
  pads it to 32 and overflows."""
  engine, vanilla, config = setup
  prompt = qwen3_tokenizer.decode(list(range(1000, 1020)))
  assert len(engine._sampler.tokenize(prompt)) == 20  # pylint: disable=protected-access
  turn2 = dataclasses.replace(config, max_tokens_to_generate=4)
  with pytest.raises(ValueError, match="cache size 24"):
    vanilla.generate([prompt], turn2)  # the defect
  assert 1 <= len(engine.generate([prompt], turn2).tokens[0]) <= 5  # up to 4 tokens and an EOS
  with pytest.raises(ValueError, match=r"prompt of 20 tokens plus 8 tokens to generate exceeds the KV cache of 24"):
    engine.generate([prompt], config)
