"""Our rollout engine fixes google-tunix 0.1.7 sampler defects; each test fails on the vanilla one."""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl import common
from tunix.rl.rollout import base_rollout, vanilla_rollout

from maxtext.integration.tunix.rollout import BatchedRolloutEngine, RolloutEngine
from maxtext.models import load
from maxtext.models.decoder import Decoder
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

PROMPTS = ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"] * 2


@pytest.fixture(scope="module")
def setup(qwen3_tokenizer):
  cfg = make_config("model_name=qwen3-tiny", "max_prompt_length=16", "max_response_length=8")
  mesh, _ = create_meshes(cfg.mesh, agentic=False)
  model = load.load_model(cfg.model, mesh)
  config = base_rollout.RolloutConfig(
    max_tokens_to_generate=8,
    max_prompt_length=16,
    kv_cache_size=24,
    temperature=1.0,
    top_p=1.0,
    top_k=None,
    eos_tokens=[qwen3_tokenizer.eos_token_id],
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
  assert len(engine.sampler.tokenize(prompt)) == 20
  turn2 = dataclasses.replace(config, max_tokens_to_generate=4)
  with pytest.raises(ValueError, match="cache size 24"):
    vanilla.generate([prompt], turn2)  # the defect
  assert 1 <= len(engine.generate([prompt], turn2).tokens[0]) <= 5  # up to 4 tokens and an EOS
  with pytest.raises(ValueError, match=r"prompt of 20 tokens plus 8 tokens to generate exceeds the KV cache of 24"):
    engine.generate([prompt], config)


@pytest.fixture(scope="module")
def batched(setup, qwen3_tokenizer):
  engine, _, config = setup
  return BatchedRolloutEngine(engine.model(), qwen3_tokenizer, engine.mesh, config, seed=0, max_batch_size=4)


def test_batched_engine_greedy_output_matches_tunix_sampler(setup, batched):
  """Same prompts, greedy: our continuous batcher and Tunix's sampler agree token for token, and the
  prompt comes back left-padded to max_prompt_length as the learners expect."""
  engine, _, config = setup
  greedy = dataclasses.replace(config, temperature=0.0, top_p=None)
  prompts = [PROMPTS[0], "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"]
  theirs = engine.generate(prompts, greedy)
  ours = batched.generate(prompts, dataclasses.replace(greedy, return_logprobs=True))
  assert _tokens(ours) == _tokens(theirs) and ours.text == theirs.text
  assert ours.left_padded_prompt_tokens.shape == (2, 16)
  np.testing.assert_array_equal(ours.left_padded_prompt_tokens, theirs.left_padded_prompt_tokens)
  assert [len(lp) for lp in ours.logprobs] == [len(t) for t in ours.tokens]


def test_batched_engine_samples_fresh_reproducible_tokens_with_logprobs(setup, batched):
  _, _, config = setup
  first, second = batched.generate(PROMPTS, config), batched.generate(PROMPTS, config)
  assert _tokens(first) != _tokens(second) and first.logprobs is None
  seeded = dataclasses.replace(config, seed=123, return_logprobs=True)
  a, b = batched.generate(PROMPTS, seeded), batched.generate(PROMPTS, seeded)
  assert _tokens(a) == _tokens(b) and _tokens(a)[0] != _tokens(a)[1]  # one key per prompt of a call
  assert all(np.all(lp < 0) for lp in a.logprobs)
  assert [v.tolist() for v in a.versions] == [[0] * len(t) for t in a.tokens]


def test_batched_engine_keeps_eos_and_refuses_what_does_not_fit(setup, batched, qwen3_tokenizer):
  _, vanilla, config = setup
  greedy = dataclasses.replace(config, temperature=0.0, top_p=None)
  first_token = int(vanilla.generate(PROMPTS[:1], greedy).tokens[0][0])
  stop_now = dataclasses.replace(greedy, eos_tokens=[first_token])
  out = batched.generate(PROMPTS[:1], stop_now)
  assert _tokens(out) == [[first_token]] and out.text == [""]
  prompt = qwen3_tokenizer.decode(list(range(1000, 1020)))
  with pytest.raises(ValueError, match=r"prompt of 20 tokens plus 8 tokens to generate exceeds the KV cache of 24"):
    batched.generate([prompt], config)


def test_batched_engine_logprobs_agree_with_the_trainers_at_step_0(setup, batched):
  """The sampler's per-token log-probs equal what Tunix's trainer computes for the same tokens with
  the same weights (common.compute_per_token_logps at the rollout temperature): max |diff| < 1e-4."""
  _, _, config = setup
  sampled = dataclasses.replace(config, temperature=0.8, top_k=20, seed=7, return_logprobs=True)
  out = batched.generate(PROMPTS, sampled)
  width = max(len(t) for t in out.tokens)
  completions = np.full((len(out.tokens), width), batched.pad_id(), np.int32)
  for row, t in zip(completions, out.tokens):
    row[: len(t)] = t
  graphdef, state = nnx.split(batched.model())
  trainer = np.asarray(
    common.compute_per_token_logps(
      graphdef,
      state,
      prompt_tokens=jnp.asarray(out.left_padded_prompt_tokens),
      completion_tokens=jnp.asarray(completions),
      pad_id=batched.pad_id(),
      eos_id=batched.eos_id(),
      temperature=0.8,
    )
  )
  for i, lp in enumerate(out.logprobs):
    np.testing.assert_allclose(lp, trainer[i, : len(lp)], atol=1e-4)


def test_token_id_prompts_sample_like_their_text(setup, batched, qwen3_tokenizer):
  """Both engines take a prompt as token ids (a conversation's exact token stream) and continue it
  as they would its text."""
  engine, _, config = setup
  greedy = dataclasses.replace(config, temperature=0.0, top_p=None)
  ids = np.asarray(qwen3_tokenizer.encode(PROMPTS[0], add_special_tokens=False), np.int32)
  for e in (engine, batched):
    text, tokens = e.generate(PROMPTS[:1], greedy), e.generate([ids], greedy)
    assert _tokens(tokens) == _tokens(text) and tokens.text == text.text
    np.testing.assert_array_equal(tokens.left_padded_prompt_tokens, text.left_padded_prompt_tokens)


@pytest.mark.parametrize("which", ["vanilla", "batched"])
def test_a_sampled_pad_token_ends_the_completion(setup, batched, which, monkeypatch):
  """Tunix masks the pad id as padding, so a completion must end where the policy sampled it: the
  greedy continuation's first token made the pad id comes back as the only token, nothing after it."""
  engine = setup[0] if which == "vanilla" else batched
  greedy = dataclasses.replace(setup[2], temperature=0.0, top_p=None)
  full = _tokens(engine.generate(PROMPTS[:1], greedy))[0]
  pad = full[0]
  cut = [pad]
  assert len(full) > 1 and pad != engine.eos_id()
  monkeypatch.setattr(engine, "pad_id", lambda: pad)
  out = engine.generate(PROMPTS[:1], greedy)
  assert _tokens(out) == [cut]
  assert out.text[0] == engine._tokenizer.decode(cut[:-1]) if which == "batched" else True


@pytest.mark.parametrize("which", ["vanilla", "batched"])
def test_old_policy_log_probs_are_at_the_sampling_temperature(setup, batched, which):
  """get_per_token_logps (the old policy with rl.num_iterations > 1) scores at the rollout
  temperature, as the trainer's loss does, so the first update's ratio is 1; at temperature 1 it
  would not be. The batched engine's own sampling log-probs agree with it."""
  engine = setup[0] if which == "vanilla" else batched
  config = dataclasses.replace(setup[2], temperature=0.7, seed=5, return_logprobs=which == "batched")
  engine.temperature = 0.7  # as built from that rollout config
  out = engine.generate(PROMPTS, config)
  prompt = jnp.asarray(out.left_padded_prompt_tokens)
  completion = jnp.asarray(np.stack([np.pad(t, (0, 8 - len(t)), constant_values=engine.pad_id()) for t in out.tokens]))
  graphdef, state = nnx.split(engine.model())
  trainer = lambda temperature: np.asarray(
    common.compute_per_token_logps(
      graphdef,
      state,
      prompt_tokens=prompt,
      completion_tokens=completion,
      pad_id=engine.pad_id(),
      eos_id=engine.eos_id(),
      temperature=temperature,
    )
  )
  old = np.asarray(engine.get_per_token_logps(prompt, completion))
  mask = np.asarray(completion) != engine.pad_id()
  np.testing.assert_allclose(old[mask], trainer(0.7)[mask], atol=1e-5)
  assert np.abs(old[mask] - trainer(1.0)[mask]).max() > 0.05
  if which == "batched":
    sampled = np.concatenate([lp for lp in out.logprobs])
    np.testing.assert_allclose(sampled, old[mask], atol=1e-4)


@pytest.mark.parametrize("which", ["vanilla", "batched"])
def test_a_named_request_draws_the_same_whatever_came_before(setup, batched, which):
  """With the key keys.for_request(ids) as its seed a call's draws depend on the ids only: the calls
  before it (other threads', in an agentic run) change nothing, and other ids draw differently."""
  engine = setup[0] if which == "vanilla" else batched
  config = setup[2]

  def named(*ids):
    return dataclasses.replace(config, seed=engine.keys.for_request(*ids))

  first = _tokens(engine.generate(PROMPTS[:1], named(7, 1, 0)))
  engine.generate(PROMPTS, config)  # an unnamed call moves the step's call counter
  again = _tokens(engine.generate(PROMPTS[:1], named(7, 1, 0)))
  other = _tokens(engine.generate(PROMPTS[:1], named(7, 2, 0)))
  assert first == again and first != other


def test_tunix_sampler_prefill_takes_the_last_positions_logits_only(setup, qwen3_tokenizer, monkeypatch):
  """Tunix's sampler asks a model whose call has decode_only_last_token for the prompt's last logits
  only: its prefill computes [B, 1, vocab] logits, not [B, prompt, vocab] (those equal the last row of
  the whole logits, tests/unit/test_model.py); every call the engine traces returns one position."""
  engine, _, config = setup
  shapes = []
  call = Decoder.__call__

  @functools.wraps(call)
  def recording(self, *args, **kwargs):
    logits, cache = call(self, *args, **kwargs)
    shapes.append(logits.shape)
    return logits, cache

  monkeypatch.setattr(Decoder, "__call__", recording)
  fresh = RolloutEngine(engine.model(), qwen3_tokenizer, engine.mesh, config, seed=0)
  fresh.generate(["<|im_start|>user\nA longer prompt than before<|im_end|>\n<|im_start|>assistant\n"] * 2, config)
  assert shapes and all(shape[1] == 1 for shape in shapes), shapes
