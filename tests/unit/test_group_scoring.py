"""maxtext.rl.group_scoring: a group's layout under one prompt (failed episodes, first prompts that
differ, a prompt over the budget) and its padding against Tunix's own padding functions, and its old
log-probs, importance weights, degenerate masking and metrics against hand-computed values."""

import json
import math

import numpy as np
import pytest
from tunix.rl.agentic import utils as agentic_utils

from maxtext.rl import group_scoring as gs
from maxtext.rl.episode import Episode

PAD, EOS = 0, 2
SHAPES = gs.Shapes(max_prompt_length=4, max_response_length=3, pad_id=PAD, eos_id=EOS)


def _sample(prompt, completion, mask, logps=None, timings=None, versions=None):
  return Episode(
    prompt_ids=np.asarray(prompt, np.int32),
    completion_ids=np.asarray(completion, np.int32),
    completion_mask=np.asarray(mask, np.int32),
    logprobs=None if logps is None else np.asarray(logps),
    versions=None if versions is None else np.asarray(versions, np.int32),
    version=0,
    conversation=[],
    example={},
    group_id=0,
    timings=timings or {},
  )


def _options(sampler_is=False, mask_degenerate=False, threshold=2.0):
  return gs.Options(sampler_is=sampler_is, sampler_is_threshold=threshold, mask_degenerate=mask_degenerate)


def _value(metrics, name):
  return float(metrics[name][0])


def test_padding_is_tunixs():
  """A laid-out group: completions shorter than the budget, exact and empty, float32 and float64
  log-probs and none: rows as Tunix's pad_prompt_and_completion and right_pad make them."""
  rng = np.random.default_rng(0)
  samples = [
    _sample([5, 6], [7, 8], [1, 1], rng.normal(size=2).astype(np.float32)),
    _sample([5, 6], [7, 8, 9], [1, 0, 1], rng.normal(size=3)),
    _sample([5, 6], [7], [1], rng.normal(size=1).astype(np.float32)),
    _sample([5, 6], [], [], None),
  ]
  padded = gs.pad(samples, SHAPES, sampler_logps=True)
  for i, s in enumerate(samples):
    prompt, completion, _ = agentic_utils.pad_prompt_and_completion(s.prompt_ids, s.completion_ids, 4, 3, PAD)
    np.testing.assert_array_equal(padded.prompt_ids[i], prompt)
    np.testing.assert_array_equal(padded.completion_ids[i], completion)
    np.testing.assert_array_equal(padded.completion_mask[i], agentic_utils.right_pad(s.completion_mask, 3, 0))
    expected = np.zeros(3) if s.logprobs is None else agentic_utils.right_pad(s.logprobs, 3, 0.0, s.logprobs.dtype)
    np.testing.assert_array_equal(padded.sampler_logps[i], expected)
  assert padded.prompt_ids.dtype == padded.completion_ids.dtype == padded.completion_mask.dtype == np.int32
  assert padded.prompt_length == 2  # the group's prompt, unpadded
  assert padded.prompt_metrics()["generation/prompts/max_length"] == (2, np.max)
  assert gs.pad(samples, SHAPES, sampler_logps=False).sampler_logps is None


@pytest.mark.parametrize(
  "samples, expected",
  [
    ([_sample([5, 6], [7], [1]), _sample([5, 9], [7], [1])], "not laid out under one prompt"),
    ([_sample([5, 6, 7, 8, 9], [7], [1])], "not laid out under one prompt of at most 4"),
    ([_sample([5], [7, 8, 9, 10], [1, 1, 1, 1])], "a completion of 4 tokens, more than 3"),
  ],
)
def test_padding_cuts_nothing(samples, expected):
  """What layout would have failed or moved is refused, never cut from the left or right."""
  with pytest.raises(ValueError, match=expected):
    gs.pad(samples, SHAPES, sampler_logps=False)


LONG = gs.Shapes(max_prompt_length=6, max_response_length=6, pad_id=PAD, eos_id=EOS)


def test_a_failed_episode_takes_its_groups_prompt_and_trains_nothing():
  group = [
    _sample([5, 6, 7], [8, 9], [1, 1], [-0.5, -1.0], versions=[3, 3]),
    _sample([1], [], [], [], versions=[]).failing("its agent raised before its first call"),
  ]
  laid = gs.layout(group, LONG)
  assert laid[0] is group[0]  # the trained episode as it was
  assert laid[1].failed and laid[1].failure == "its agent raised before its first call"
  assert laid[1].prompt_ids.tolist() == [5, 6, 7] and len(laid[1].completion_ids) == 0
  padded = gs.pad(laid, LONG, sampler_logps=True)
  assert (padded.prompt_ids[0] == padded.prompt_ids[1]).all()
  assert padded.completion_mask[1].sum() == 0


def test_first_prompts_that_differ_keep_their_own_context_in_the_completion():
  """[5 6 7 | 8] and [5 6 | 4 4] share [5 6]: each keeps the rest of its prompt as context (mask 0,
  log-prob 0, version -1) before what it sampled, so it is scored after exactly the tokens it was
  sampled after."""
  group = [
    _sample([5, 6, 7], [8], [1], [-0.5], versions=[2]),
    _sample([5, 6, 4, 4], [9, 9], [1, 1], [-0.25, -0.75], versions=[1, 1]),
  ]
  laid = gs.layout(group, LONG)
  assert [e.prompt_ids.tolist() for e in laid] == [[5, 6], [5, 6]]
  assert laid[0].completion_ids.tolist() == [7, 8] and laid[0].completion_mask.tolist() == [0, 1]
  assert laid[1].completion_ids.tolist() == [4, 4, 9, 9] and laid[1].completion_mask.tolist() == [0, 0, 1, 1]
  assert laid[1].logprobs.tolist() == [0.0, 0.0, -0.25, -0.75] and laid[1].versions.tolist() == [-1, -1, 1, 1]
  for before, after in zip(group, laid):  # the tokens scored: the same stream, the same trained tokens
    assert (
      np.concatenate([after.prompt_ids, after.completion_ids]).tolist()
      == np.concatenate([before.prompt_ids, before.completion_ids]).tolist()
    )
    assert after.completion_ids[after.completion_mask == 1].tolist() == before.completion_ids.tolist()
  gs.pad(laid, LONG, sampler_logps=True)  # laid out: pads without complaint


@pytest.mark.parametrize(
  "group, failed, reason",
  [
    # a first prompt over max_prompt_length=6 fails, whatever its siblings
    ([_sample([5] * 7, [8], [1]), _sample([5, 6], [8], [1])], [True, False], "7 tokens, more than max_prompt_length=6"),
    # no shared first token: the one whose prompt is less common fails
    (
      [_sample([9, 6], [8], [1]), _sample([5, 6], [8], [1]), _sample([5, 6], [7], [1])],
      [True, False, False],
      "its first prompt of 2 tokens differs from its group's after 0",
    ),
    # the rest of its prompt and its completion do not fit max_response_length=6 (the shorter prompt first)
    (
      [_sample([5, 1, 2, 3, 4, 4], [8, 8], [1, 1]), _sample([5], [8], [1])],
      [True, False],
      "differs from its group's after 1: the rest of its prompt and its 2 completion tokens do not fit",
    ),
    # a per-episode system turn: the shared prefix is short; the most common prompt keeps the group
    (
      [
        _sample([5, 6, 7, 8], [8] * 3, [1] * 3),
        _sample([5, 1, 2, 3], [8] * 4, [1] * 4),
        _sample([5, 6, 7, 8], [9], [1]),
      ],
      [False, True, False],
      "differs from its group's after 1",
    ),
  ],
)
def test_what_cannot_be_laid_out_fails_with_its_reason(group, failed, reason):
  laid = gs.layout(group, LONG)
  assert [e.failed for e in laid] == failed
  assert reason in next(e.failure for e in laid if e.failed)
  assert all(e.completion_mask.sum() == 0 for e in laid if e.failed)
  gs.pad(laid, LONG, sampler_logps=False)


def test_a_group_that_all_failed_has_the_first_episodes_prompt_cut_to_the_budget():
  group = [_sample([1, 2, 3, 4, 5, 6, 7, 8], [], []).failing("a"), _sample([], [], []).failing("b")]
  laid = gs.layout(group, LONG)
  assert [e.prompt_ids.tolist() for e in laid] == [[3, 4, 5, 6, 7, 8]] * 2  # it trains nothing
  assert gs.pad(laid, LONG, sampler_logps=False).completion_mask.sum() == 0


def test_clipped_compares_the_masks_last_entry_with_eos():
  """A sample at the budget counts unless its mask's last entry equals eos_id (2 here)."""
  samples = [
    _sample([1], [7, 8], [1, 1]),  # short of the budget
    _sample([1], [7, 8, EOS], [1, 1, 1]),  # at the budget, mask ends 1 != 2: clipped
    _sample([1], [7, 8, 9], [1, 1, 2]),  # at it, mask ends 2 == eos_id: not clipped
  ]
  assert gs.pad(samples, SHAPES, sampler_logps=False).clipped == 1


def test_completion_and_advantage_metrics():
  samples = [_sample([1], [7, 8, 9], [1, 1, 1]), _sample([1], [7, 8], [1, 0])]
  padded = gs.pad(samples, SHAPES, sampler_logps=False)
  scored = gs.score(samples, padded, np.array([1.0, -1.0]), None, _options())
  m = scored.metrics
  assert _value(m, "generation/completions/mean_length") == 2.0  # 3 and 1 sampled tokens
  assert _value(m, "generation/completions/max_length") == 3.0
  assert _value(m, "generation/completions/min_length") == 1.0
  assert _value(m, "generation/completions/clip_ratio") == 0.5
  assert _value(m, "rewards/advantage/mean") == 0.0
  assert _value(m, "rewards/advantage/std") == 1.0
  assert m["rewards/advantage/max"] == (1.0, np.max) and m["rewards/advantage/min"] == (-1.0, np.min)
  assert not any(k.startswith(("sampler_trainer/", "sampler_is/")) for k in m)


@pytest.mark.parametrize(
  "with_sampler, with_trainer, sampler_is, old",
  [
    (True, False, False, "sampler"),  # batched engine
    (True, True, False, "sampler"),  # the trainer's only for the agreement metrics
    (True, True, True, "trainer"),  # sampler_is=token
    (False, True, False, "trainer"),  # vanilla engine
    (False, False, False, None),
  ],
)
def test_old_logps(with_sampler, with_trainer, sampler_is, old):
  samples = [_sample([1], [7, 8], [1, 1], [-0.5, -1.0]), _sample([1], [7], [1], [-2.0])]
  padded = gs.pad(samples, SHAPES, sampler_logps=with_sampler)
  trainer = np.full((2, 3), -0.25, np.float32) if with_trainer else None
  scored = gs.score(samples, padded, np.array([1.0, -1.0]), trainer, _options(sampler_is=sampler_is))
  expected = {"sampler": padded.sampler_logps, "trainer": trainer, None: None}[old]
  if expected is None:
    assert scored.old_logps is None
  else:
    np.testing.assert_array_equal(scored.old_logps, expected)
  assert (scored.sampler_is_weights is not None) == (with_sampler and with_trainer and sampler_is)


def test_agreement_metrics():
  """Over the masked tokens only: |logp diff|, |prob diff| and the probabilities' Pearson
  correlation (numpy's corrcoef on the masked tokens)."""
  p_sampler = np.array([[0.5, 0.25, 0.9], [0.1, 0.3, 0.7]])
  p_trainer = np.array([[0.5, 0.5, 0.1], [0.2, 0.3, 0.7]])
  mask = np.array([[1, 1, 0], [1, 1, 1]])
  m = gs.agreement_metrics(np.log(p_sampler).astype(np.float32), np.log(p_trainer).astype(np.float32), mask)
  keep = mask.astype(bool)
  log_diff = np.abs(np.log(p_sampler) - np.log(p_trainer))[keep]
  prob_diff = np.abs(p_sampler - p_trainer)[keep]
  assert _value(m, "sampler_trainer/logp_diff_mean") == pytest.approx((math.log(2) + math.log(2)) / 5, rel=1e-6)
  assert _value(m, "sampler_trainer/logp_diff_max") == pytest.approx(log_diff.max(), rel=1e-6)
  assert _value(m, "sampler_trainer/prob_diff_mean") == pytest.approx((0.25 + 0.1) / 5, rel=1e-6)
  assert _value(m, "sampler_trainer/prob_diff_max") == pytest.approx(prob_diff.max(), rel=1e-6)
  pearson = np.corrcoef(p_sampler[keep], p_trainer[keep])[0, 1]
  assert _value(m, "sampler_trainer/probs_pearson_corr") == pytest.approx(pearson, rel=1e-5)


def test_sampler_is_weights():
  """Ratios 3, 0.5 and e^20 (the log-ratio 30 clipped to 20) truncated at 2; the third token is
  off the mask: weights 2, 0.5, 0; mean 1.25, max 2, half the masked tokens over the threshold."""
  sampler = np.zeros((1, 3), np.float32)
  trainer = np.array([[math.log(3.0), math.log(0.5), 30.0]], np.float32)
  weights, m = gs.sampler_is_weights(sampler, trainer, np.array([[1, 1, 0]]), threshold=2.0)
  np.testing.assert_allclose(weights, [[2.0, 0.5, 0.0]], rtol=1e-6)
  assert _value(m, "sampler_is/weight_mean") == pytest.approx(1.25, rel=1e-6)
  assert _value(m, "sampler_is/weight_max") == pytest.approx(2.0)
  assert _value(m, "sampler_is/frac_clipped_at_threshold") == 0.5


@pytest.mark.parametrize("advantages, masked", [([0.0, 0.0], True), ([1e-9, -1e-9], True), ([0.5, -0.5], False)])
def test_degenerate_group_masking(advantages, masked):
  """A group whose advantages are all (close to) zero trains on no token, and its metrics see the
  empty mask (the means divide by 1); without the option its mask is kept."""
  samples = [_sample([1], [7, 8], [1, 1], [-0.5, -1.0]), _sample([1], [7], [1], [-2.0])]
  padded = gs.pad(samples, SHAPES, sampler_logps=True)
  trainer = np.full((2, 3), -0.25, np.float32)
  scored = gs.score(samples, padded, np.array(advantages), trainer, _options(sampler_is=True, mask_degenerate=True))
  if masked:
    assert not np.asarray(scored.completion_mask).any()
    assert not np.asarray(scored.sampler_is_weights).any()
    assert _value(scored.metrics, "generation/completions/max_length") == 0.0
    assert _value(scored.metrics, "sampler_trainer/logp_diff_mean") == 0.0
  else:
    np.testing.assert_array_equal(scored.completion_mask, padded.completion_mask)
  kept = gs.score(samples, padded, np.array(advantages), trainer, _options(sampler_is=True))
  np.testing.assert_array_equal(kept.completion_mask, padded.completion_mask)


def test_timing_metrics():
  """Every sub-key any sample has, a missing one counting 0."""
  samples = [
    _sample([1], [7], [1], timings={"env_time": {"reset": 1.0, "step": 4.0}, "reward_time": {}}),
    _sample([1], [7], [1], timings={"env_time": {"reset": 3.0}, "reward_time": {}}),
  ]
  m = gs.timing_metrics(samples)
  assert m == {
    "trajectory/env_time/reset/mean": (2.0, np.mean),
    "trajectory/env_time/reset/max": (3.0, np.max),
    "trajectory/env_time/reset/min": (1.0, np.min),
    "trajectory/env_time/step/mean": (2.0, np.mean),
    "trajectory/env_time/step/max": (4.0, np.max),
    "trajectory/env_time/step/min": (0.0, np.min),
  }


def test_a_resume_keeps_the_episodes_of_the_steps_it_resumes_after(tmp_path):
  """episode.keep_through: the rows of later steps (the rerun scores them again) and a torn tail go."""
  from maxtext.rl import episode

  path = tmp_path / "episodes.jsonl"
  rows = [{"step": s, "group": g} for s in (1, 2, 3) for g in (0, 1)]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "gro')
  assert episode.keep_through(str(path), 2) == 3
  assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:4]
  assert episode.keep_through(str(tmp_path / "none.jsonl"), 2) == 0
