"""The continuous batcher against a cache-free reference decode of the same model."""

import functools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from maxtext.inference.continuous_batching import ContinuousBatcher, SamplingParams
from maxtext.models import load
from maxtext.models.decoder import DecodeCopy
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(1, 1000, size=n).tolist() for n in (3, 9, 17, 5, 12, 7)]


@pytest.fixture(scope="module")
def model():
  cfg = make_config("model_name=qwen3-tiny", "vocab_size=1024")  # a small vocabulary keeps the reference quick
  return load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])


_WIDTH = 64


@functools.cache
def _forward(model):
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(tokens):  # [_WIDTH], causal: padding after the sequence does not reach it
    logits, _ = nnx.merge(graphdef, state)(
      tokens[None], jnp.arange(_WIDTH)[None], None, jnp.tril(jnp.ones((1, _WIDTH, _WIDTH), bool))
    )
    return logits[0]

  return forward


def _logits(model, tokens):
  """Full-sequence forward without a KV cache: [T, V] float32."""
  padded = np.zeros(_WIDTH, np.int32)
  padded[: len(tokens)] = tokens
  return np.asarray(_forward(model)(padded))[: len(tokens)]


def _greedy(model, prompt, n):
  tokens = list(prompt)
  for _ in range(n):
    tokens.append(int(np.argmax(_logits(model, tokens)[-1])))
  return tokens[len(prompt) :]


def test_greedy_completions_match_the_reference_with_more_requests_than_slots(model):
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=4, prefill_chunk=8)  # 17 tokens: two chunks
  budgets = [8, 5, 12, 3, 10, 6]
  futures = [batcher.submit(p, SamplingParams(n, temperature=0.0)) for p, n in zip(PROMPTS, budgets)]
  for prompt, n, future in zip(PROMPTS, budgets, futures):
    done = future.result(timeout=120)
    assert done.tokens.tolist() == _greedy(model, prompt, n) and not done.stopped
  # Six requests of 44 tokens in all through four slots: finished requests free slots for waiting ones.
  assert batcher.decode_steps < sum(budgets) - len(budgets)
  batcher.close()


def test_a_last_chunk_that_would_pass_the_cache_end_starts_earlier(model):
  # A 20-token prompt (19 prefilled, the last one decoded) in 16-token chunks and a 24-token cache:
  # the second chunk covers positions 8..23.
  prompt = PROMPTS[2] + [5, 6, 7]
  batcher = ContinuousBatcher(model, cache_size=24, max_batch_size=2, prefill_chunk=16)
  done = batcher.submit(prompt, SamplingParams(4, temperature=0.0)).result(timeout=120)
  assert done.tokens.tolist() == _greedy(model, prompt, 4)
  batcher.close()


def test_a_one_token_prompt_needs_no_prefill(model):
  batcher = ContinuousBatcher(model, cache_size=16, max_batch_size=2)
  done = batcher.submit([7], SamplingParams(5, temperature=0.0)).result(timeout=120)
  assert done.tokens.tolist() == _greedy(model, [7], 5)
  batcher.close()


def test_cache_rows_grow_with_demand_and_shrink_when_few_are_busy(model):
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=8)
  assert batcher.rows == 1
  long = batcher.submit(PROMPTS[0], SamplingParams(20, temperature=0.0))  # in slot 0
  short = batcher.submit_many(PROMPTS[1:5], SamplingParams(2, temperature=0.0))  # 5 busy: 8 rows
  assert long.result(timeout=120).tokens.tolist() == _greedy(model, PROMPTS[0], 20)
  for prompt, future in zip(PROMPTS[1:5], short):
    assert future.result(timeout=120).tokens.tolist() == _greedy(model, prompt, 2)
  # Once the short requests are done, the one busy slot shrinks the cache to 2 rows (4 x 1 <= 4).
  assert batcher.rows == 2
  batcher.close()


def test_sampled_tokens_and_logprobs_follow_the_scaled_distribution(model):
  """Each token lies in the reference top-k and its log-prob is log_softmax(logits / T) there."""
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=4)
  params = SamplingParams(6, temperature=0.7, top_k=5)
  done = batcher.submit(PROMPTS[1], params, jax.random.PRNGKey(1)).result(timeout=120)
  tokens = PROMPTS[1] + done.tokens.tolist()
  logits = _logits(model, tokens)[len(PROMPTS[1]) - 1 : -1]  # the distributions the tokens were drawn from
  for row, token, logp in zip(logits, done.tokens, done.logprobs):
    assert token in np.argsort(row)[-5:]
    np.testing.assert_allclose(logp, jax.nn.log_softmax(row / 0.7)[token], atol=1e-4)
  batcher.close()


def test_a_request_draws_the_same_tokens_alone_or_in_a_crowd(model):
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=4)
  params = SamplingParams(10, temperature=1.0)
  key = jax.random.PRNGKey(3)
  alone = batcher.submit(PROMPTS[0], params, key).result(timeout=120)
  crowd = [batcher.submit(p, params, jax.random.PRNGKey(10 + i)) for i, p in enumerate(PROMPTS)]
  again = batcher.submit(PROMPTS[0], params, key).result(timeout=120)
  assert again.tokens.tolist() == alone.tokens.tolist()
  others = [f.result(timeout=120).tokens.tolist() for f in crowd]
  assert len({tuple(t) for t in others}) > 1  # different keys, different samples
  batcher.close()


def test_eos_ends_a_request_and_is_kept(model):
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=2)
  first = _greedy(model, PROMPTS[0], 3)
  done = batcher.submit(PROMPTS[0], SamplingParams(8, temperature=0.0, eos_ids=(first[2],))).result(timeout=120)
  assert done.tokens.tolist() == first and done.stopped
  batcher.close()


def test_concurrent_callers_share_decode_steps(model):
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=8)
  results = [None] * 16

  def call(i):
    results[i] = batcher.submit(PROMPTS[i % 6], SamplingParams(8, temperature=0.0)).result(timeout=300)

  threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert [r.tokens.tolist() for r in results[:6]] == [_greedy(model, p, 8) for p in PROMPTS]
  assert all(r.tokens.tolist() == results[i % 6].tokens.tolist() for i, r in enumerate(results))
  assert batcher.decode_steps <= 16 * 7 // 2  # sixteen 8-token requests decoded at least two at a time
  batcher.close()


def test_new_weights_apply_between_decode_steps_and_tag_tokens(model):
  """A trainer's in-place update of the model reaches a request in flight from the next decode step
  on."""
  policy = nnx.clone(model)
  zeroed = jax.tree.map(jnp.zeros_like, nnx.state(policy))  # all-zero logits: argmax token 0
  calls = {"n": 0}

  def version():  # read at construction and once per scheduler round
    calls["n"] += 1
    if calls["n"] == 5:  # the trainer updates the weights before round 4
      nnx.update(policy, zeroed)
    return 0 if calls["n"] <= 4 else 1

  batcher = ContinuousBatcher(policy, 64, 2, version=version)
  done = batcher.submit(PROMPTS[2], SamplingParams(8, temperature=0.0)).result(timeout=120)
  # Rounds 1 to 3 each decode one token (round 1 prefills first), then the new weights.
  assert done.versions.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
  assert done.tokens[:3].tolist() == _greedy(model, PROMPTS[2], 3) and set(done.tokens[3:].tolist()) == {0}
  batcher.close()


def test_a_later_turn_prefills_only_what_follows_the_held_conversation(model):
  """Turn 2 (turn 1's prompt and completion plus a tool's tokens) reuses turn 1's keys and values and
  gives the reference's tokens and log-probs."""
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=2, prefill_chunk=16)
  params = SamplingParams(6, temperature=0.8)
  turn1 = batcher.submit(PROMPTS[2], params, jax.random.PRNGKey(5)).result(timeout=120)
  second = PROMPTS[2] + turn1.tokens.tolist() + [11, 12, 13]
  turn2 = batcher.submit(second, params, jax.random.PRNGKey(6)).result(timeout=120)
  # Held: the 17 prompt tokens and 5 of 6 completion tokens (the last was never fed back).
  assert batcher.reused_tokens == 17 + 5 and batcher.prompt_tokens == 17 + len(second)
  logits = _logits(model, second + turn2.tokens.tolist())[len(second) - 1 : -1]
  for row, token, logp in zip(logits, turn2.tokens, turn2.logprobs):
    np.testing.assert_allclose(logp, jax.nn.log_softmax(row / 0.8)[token], atol=1e-4)
  fresh = ContinuousBatcher(model, cache_size=64, max_batch_size=2)
  again = fresh.submit(second, params, jax.random.PRNGKey(6)).result(timeout=120)
  assert again.tokens.tolist() == turn2.tokens.tolist() and fresh.reused_tokens == 0
  batcher.close()
  fresh.close()


def test_prompts_sharing_a_system_prompt_reuse_it_until_the_weights_change(model):
  system = PROMPTS[4]  # 12 tokens
  version = {"v": 0}
  batcher = ContinuousBatcher(model, 64, 2, version=lambda: version["v"])
  first = batcher.submit(system + [7, 8], SamplingParams(3, temperature=0.0)).result(timeout=120)
  second = batcher.submit(system + [9], SamplingParams(3, temperature=0.0)).result(timeout=120)
  assert batcher.reused_tokens == 12
  assert second.tokens.tolist() == _greedy(model, system + [9], 3)
  version["v"] = 1
  batcher.submit(system + [10], SamplingParams(3, temperature=0.0)).result(timeout=120)
  assert batcher.reused_tokens == 12  # held keys and values of version 0 are not used under version 1
  assert first.versions.tolist() == [0, 0, 0]
  batcher.close()


def test_a_group_submitted_together_reads_its_prompt_once(model):
  batcher = ContinuousBatcher(model, 64, 8)
  params = SamplingParams(5, temperature=1.0)
  keys = [jax.random.PRNGKey(i) for i in range(4)]
  group = [f.result(timeout=120) for f in batcher.submit_many([PROMPTS[1]] * 4, params, keys)]
  assert batcher.reused_tokens == 3 * 8  # three copies of the first sample's 9-token prompt less its last token
  for key, done in zip(keys, group):  # the same draws as a request alone in a fresh batcher
    alone = ContinuousBatcher(model, 64, 8)
    assert alone.submit(PROMPTS[1], params, key).result(timeout=120).tokens.tolist() == done.tokens.tolist()
    alone.close()
  batcher.close()


def test_a_request_copies_its_prompt_from_a_busy_slot(model):
  """A sample arriving while another with the same prompt decodes (the agentic learner's separate
  calls) copies the prompt's keys and values from that slot and decodes what it decodes alone."""
  batcher = ContinuousBatcher(model, 64, 4)
  first = batcher.submit(PROMPTS[2], SamplingParams(40, temperature=0.0))
  deadline = time.time() + 120
  while batcher.decode_steps < 2:  # the first request is decoding
    assert time.time() < deadline, "the first request never started decoding"
    time.sleep(0.01)
  second = batcher.submit(PROMPTS[2], SamplingParams(6, temperature=0.0)).result(timeout=120)
  assert not first.done() and batcher.reused_tokens == 16  # the 17-token prompt less its last token
  assert second.tokens.tolist() == _greedy(model, PROMPTS[2], 6)
  assert first.result(timeout=120).tokens.tolist() == _greedy(model, PROMPTS[2], 40)
  batcher.close()


def test_requests_that_do_not_fit_are_refused(model):
  batcher = ContinuousBatcher(model, cache_size=24, max_batch_size=2)
  with pytest.raises(ValueError, match="a prompt of 17 tokens plus 8 tokens to generate exceeds the KV cache of 24"):
    batcher.submit(PROMPTS[2], SamplingParams(8))
  with pytest.raises(ValueError, match="empty prompt"):
    batcher.submit([], SamplingParams(8))
  batcher.close()
  with pytest.raises(RuntimeError, match="closed"):
    batcher.submit(PROMPTS[0], SamplingParams(2))


def test_a_failing_step_fails_every_waiting_request_instead_of_hanging(model):
  calls = []

  def version():  # fine when the batcher is built, then failing in its scheduler
    calls.append(1)
    if len(calls) > 1:
      raise RuntimeError("weights unavailable")
    return 0

  batcher = ContinuousBatcher(model, 64, 2, version=version)
  futures = batcher.submit_many(PROMPTS[:3], SamplingParams(4, temperature=0.0))
  for future in futures:
    with pytest.raises(RuntimeError, match="weights unavailable"):
      future.result(timeout=60)
  with pytest.raises(RuntimeError, match="the batcher failed: weights unavailable"):
    batcher.submit(PROMPTS[0], SamplingParams(4, temperature=0.0))


@pytest.mark.parametrize("scan", ["false", "true"])
def test_decode_rate_leaves_compiling_steps_out_and_counts_the_bytes_a_step_reads(model, scan):
  if scan == "false":  # the module's model is scanned (the default); both decode with unrolled layers
    cfg = make_config("model_name=qwen3-tiny", "vocab_size=1024", "scan_layers=false")
    model = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  assert model.config.scan_layers == (scan == "true")
  batcher = ContinuousBatcher(model, cache_size=32, max_batch_size=2)
  assert batcher.decode_rate() is None
  batcher.submit(PROMPTS[0], SamplingParams(1, temperature=0.0)).result(timeout=120)
  assert batcher.decode_rate() is None  # its one decode step compiled the program for one row
  batcher.submit(PROMPTS[1], SamplingParams(6, temperature=0.0)).result(timeout=120)
  tokens_per_s, bytes_per_s = batcher.decode_rate()
  cfg = model.config
  weights = 4 * sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))  # float32
  kv = 2 * cfg.num_layers * 32 * cfg.num_kv_heads * cfg.head_dim * 4  # keys and values of one row
  end_index = 4 * cfg.num_layers  # int32 per row and layer (the batcher decodes with unrolled layers)
  assert tokens_per_s > 0
  assert bytes_per_s / tokens_per_s == pytest.approx(weights + kv + end_index, rel=1e-9)
  batcher.close()


def test_a_bfloat16_copy_decodes_as_its_own_forward_near_the_float32_model(model):
  """matmul_dtype=bfloat16: greedy completions through the KV cache equal greedy decoding of the same
  DecodeCopy without a cache, and the sampled tokens' log-probs stay near the float32 model's."""
  copy = DecodeCopy(model, jnp.bfloat16)
  reference = nnx.merge(copy.graphdef, copy.state())
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=4, matmul_dtype=jnp.bfloat16)
  futures = [batcher.submit(p, SamplingParams(6, temperature=0.0)) for p in PROMPTS[:4]]
  for prompt, future in zip(PROMPTS, futures):
    assert future.result(timeout=120).tokens.tolist() == _greedy(reference, prompt, 6)
  done = batcher.submit(PROMPTS[1], SamplingParams(12, temperature=1.0), jax.random.PRNGKey(3)).result(timeout=120)
  tokens = PROMPTS[1] + done.tokens.tolist()
  full = jax.nn.log_softmax(_logits(model, tokens)[len(PROMPTS[1]) - 1 : -1], axis=-1)
  float32_logps = np.take_along_axis(np.asarray(full), done.tokens[:, None], axis=-1)[:, 0]
  assert np.abs(done.logprobs - float32_logps).max() < 0.05
  batcher.close()
  # A decode step of one row reads the copy's weights (not the model's) and the row's cache.
  single = ContinuousBatcher(model, cache_size=32, max_batch_size=1, matmul_dtype=jnp.bfloat16)
  single.submit(PROMPTS[0], SamplingParams(6, temperature=0.0)).result(timeout=120)
  tokens_per_s, bytes_per_s = single.decode_rate()
  cfg = model.config
  end_index = 4 * cfg.num_layers  # int32 per row and layer (the batcher decodes with unrolled layers)
  kv_and_end_index = 2 * cfg.num_layers * 32 * cfg.num_kv_heads * cfg.head_dim * 4 + end_index
  assert bytes_per_s / tokens_per_s == pytest.approx(copy.nbytes + kv_and_end_index, rel=1e-9)
  single.close()


@pytest.mark.parametrize(
  "signal, dtype",
  [
    ("version", jnp.bfloat16),
    ("weights_changed", jnp.bfloat16),
    ("none: between busy periods", jnp.bfloat16),
    ("weights_changed", None),  # the module's model is scanned: the batcher decodes from an unrolled copy
    ("none: between busy periods", None),
  ],
)
def test_a_decode_copy_follows_the_weights(model, signal, dtype):
  """The copy (bfloat16, or a scanned model's unrolled one) is remade when the version changes or
  weights_changed() is called (from the next decode step on), and at the start of every busy period:
  samples never come from replaced weights."""
  policy = nnx.clone(model)
  zeroed = jax.tree.map(jnp.zeros_like, nnx.state(policy))  # all-zero logits: argmax token 0
  calls = {"n": 0}

  def version():  # read at construction and once per scheduler round
    calls["n"] += 1
    if calls["n"] == 5 and signal != "none: between busy periods":  # the trainer updates before round 4
      nnx.update(policy, zeroed)
      if signal == "weights_changed":
        batcher.weights_changed()
    return 1 if calls["n"] >= 5 and signal == "version" else 0

  batcher = ContinuousBatcher(policy, 64, 2, version=version, matmul_dtype=dtype)
  done = batcher.submit(PROMPTS[2], SamplingParams(8, temperature=0.0)).result(timeout=120)
  if signal == "none: between busy periods":
    assert 0 not in done.tokens.tolist()
    nnx.update(policy, zeroed)
    done = batcher.submit(PROMPTS[2], SamplingParams(8, temperature=0.0)).result(timeout=120)
    assert done.tokens.tolist() == [0] * 8
  else:  # rounds 1 to 3 each decode one token (round 1 prefills first), then the new weights
    assert 0 not in done.tokens[:3].tolist() and set(done.tokens[3:].tolist()) == {0}
  batcher.close()


def _mixed_workload(batcher, eos):
  """More requests than slots, sampled and greedy, with top-k, EOS and budgets that end mid-chunk."""
  params = [
    SamplingParams(11, temperature=1.0, eos_ids=(eos,)),
    SamplingParams(7, temperature=0.0, eos_ids=(eos,)),
    SamplingParams(13, temperature=0.8, top_k=20, eos_ids=(eos, 3)),
  ]
  prompts = PROMPTS + PROMPTS[:3]
  keys = [jax.random.PRNGKey(100 + i) for i in range(len(prompts))]
  futures = batcher.submit_many(prompts, [params[i % 3] for i in range(len(prompts))], keys)  # queued at once
  return [f.result(timeout=300) for f in futures]


def test_chunks_of_decode_steps_draw_exactly_what_single_steps_draw(model):
  """decode_steps_per_dispatch 1 and 16: the same tokens, bit-identical log-probs and the same
  stops, with requests admitted between chunks; 16 dispatches fewer decode programs."""
  eos = _greedy(model, PROMPTS[1], 4)[3]  # a token the greedy requests meet
  runs = {}
  for chunk in (1, 16):
    batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=4, steps_per_dispatch=chunk)
    runs[chunk] = (_mixed_workload(batcher, eos), batcher.decode_dispatches, batcher.decode_steps)
    batcher.close()
  (one, one_dispatches, one_steps), (many, many_dispatches, _) = runs[1], runs[16]
  for a, b in zip(one, many):
    assert a.tokens.tolist() == b.tokens.tolist() and a.stopped == b.stopped
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
  assert any(c.stopped for c in one) and not all(c.stopped for c in one)
  assert one_dispatches == one_steps and many_dispatches < one_dispatches / 3


def test_a_decoder_with_remat_decodes_in_chunks_as_without(model):
  """remat_policy=full (training memory) leaves inference alone: decoding in chunks of 16 draws what
  the decoder without remat draws (rematerializing layers inside the decode loop failed to trace)."""
  cfg = make_config("model_name=qwen3-tiny", "vocab_size=1024", "remat_policy=full")
  remat = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  nnx.update(remat, nnx.state(model))
  eos = _greedy(model, PROMPTS[1], 4)[3]
  runs = []
  for m in (model, remat):
    batcher = ContinuousBatcher(m, cache_size=64, max_batch_size=4, steps_per_dispatch=16)
    runs.append(_mixed_workload(batcher, eos))
    batcher.close()
  for a, b in zip(*runs):
    assert a.tokens.tolist() == b.tokens.tolist() and a.stopped == b.stopped
    np.testing.assert_array_equal(a.logprobs, b.logprobs)


def test_concurrent_single_requests_draw_the_same_tokens_whatever_the_chunk(model):
  """As agentic conversations submit: one request per thread, admitted whenever they arrive. The
  tokens depend only on each request's key; the log-probs on the rows decoded with it, to float32
  rounding."""
  eos = _greedy(model, PROMPTS[1], 4)[3]
  params = SamplingParams(9, temperature=1.0, top_k=50, eos_ids=(eos,))
  runs = []
  for chunk in (1, 16):
    batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=4, steps_per_dispatch=chunk)
    results = [None] * 10

    def call(i, batcher=batcher, results=results):
      time.sleep(0.01 * (i % 4))
      results[i] = batcher.submit(PROMPTS[i % 6], params, jax.random.PRNGKey(7 * i)).result(timeout=300)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    runs.append(results)
    batcher.close()
  for a, b in zip(*runs):
    assert a.tokens.tolist() == b.tokens.tolist()
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_after_the_first_round_of_groups_nothing_compiles_again(model):
  """GRPO-like rounds, each of 4 new prompts (5 to 39 tokens) x 4 samples: the first round builds
  the prefill, copy and decode programs of its shape buckets; later rounds reuse them. (Counted by
  lowering, which every new program goes through, from the persistent compilation cache or not.)"""
  compiles = []

  def listener(event, duration, **kwargs):
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
      compiles.append(event)

  jax.monitoring.register_event_duration_secs_listener(listener)
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=16, steps_per_dispatch=16)
  rng = np.random.default_rng(1)
  per_round = []
  for round_ in range(4):
    before = len(compiles)
    prompts = [rng.integers(1, 1000, size=rng.integers(5, 40)).tolist() for _ in range(4)]
    keys = [jax.random.PRNGKey(100 * round_ + i) for i in range(16)]
    futures = batcher.submit_many([p for p in prompts for _ in range(4)], SamplingParams(12, eos_ids=(5,)), keys)
    [f.result(timeout=300) for f in futures]
    per_round.append(len(compiles) - before)
  batcher.close()
  jax.monitoring.unregister_event_duration_listener(listener)
  assert per_round[0] > 0 and per_round[1:] == [0, 0, 0], per_round


def test_chunks_stream_to_the_callback_and_a_cancelled_request_leaves_its_slot(model):
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=2, steps_per_dispatch=2)
  streamed, started = [], threading.Event()

  def on_tokens(tokens, logps):
    streamed.append((list(tokens), list(logps)))
    started.set()

  done = batcher.submit(PROMPTS[0], SamplingParams(8, temperature=0.0), on_tokens=on_tokens).result(timeout=120)
  assert [t for chunk, _ in streamed for t in chunk] == done.tokens.tolist()
  assert [lp for _, logps in streamed for lp in logps] == done.logprobs.tolist()
  assert all(len(chunk) <= 2 for chunk, _ in streamed)

  started.clear()
  long = batcher.submit(PROMPTS[1], SamplingParams(50, temperature=0.0), on_tokens=on_tokens)
  assert started.wait(timeout=120)
  steps = batcher.decode_steps
  assert long.cancel()
  deadline = time.monotonic() + 60
  while batcher.active() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert batcher.active() == 0 and batcher.decode_steps - steps < 45  # it left before its budget
  # The batcher goes on serving.
  assert batcher.submit(PROMPTS[2], SamplingParams(3, temperature=0.0)).result(timeout=120).tokens.tolist() == (
    _greedy(model, PROMPTS[2], 3)
  )
  batcher.close()


def test_a_short_request_behind_a_wide_one_takes_the_first_free_slot(model):
  # Two slots, a request of four 16-token choices, then one 2-token request: first come, first served
  # would finish it last (after the wide request's third and fourth choices); fair admission gives it
  # the first free slot, so it finishes before those two, with the tokens it draws alone.
  batcher = ContinuousBatcher(model, cache_size=64, max_batch_size=2, prefill_chunk=8, steps_per_dispatch=1)
  finished = []
  wide = batcher.submit_many([PROMPTS[0]] * 4, SamplingParams(16, temperature=0.0))
  for i, f in enumerate(wide):
    f.add_done_callback(lambda _, i=i: finished.append(f"wide{i}"))
  deadline = time.monotonic() + 120
  while batcher.queued() != 2 and time.monotonic() < deadline:  # its first two choices hold both slots
    time.sleep(0.01)
  short = batcher.submit(PROMPTS[1], SamplingParams(2, temperature=0.0))
  short.add_done_callback(lambda _: finished.append("short"))
  assert short.result(timeout=120).tokens.tolist() == _greedy(model, PROMPTS[1], 2)
  for f in wide:
    f.result(timeout=120)
  assert sorted(finished[:2]) == ["wide0", "wide1"] and finished[2] == "short", finished
  batcher.close()
