"""One standard GRPO step's batch (maxtext.rl.standard_step), without Tunix, against hand-computed
values: the layout of the batch, what is scored and in how many rows a call, the overlong penalty,
dynamic sampling's rounds and the rows it keeps, the sampler importance weights and the masking of
truncated completions. The services are a deterministic sampler whose completions and log-probs
follow from the prompt's text, and a reward that reads the completion."""

import dataclasses

import numpy as np
import pytest

from maxtext.rl import shaping, standard_step

PAD, EOS, WIDTH, G = 0, 9, 4, 2


class _Sampler:
  """Completes a prompt whose name ends in the number m with the tokens m + 2, m + 3 and, where m is
  even, EOS; the log-prob of the k-th token is -0.1 * (k + 1). Rewards: the completion's length in
  tokens. Advantages: the reward minus its group's mean. Records every call."""

  def __init__(self):
    self.calls: list[tuple] = []
    self.logged: dict = {}
    self.fields: list[dict] = []
    self.handed: list[tuple] = []

  def _tokens(self, prompt: str) -> list[int]:
    m = int(prompt[1:].split("-")[-1])
    return [m + 2, m + 3] + ([EOS] if m % 2 == 0 else [])

  def generate(self, prompts, rows):
    self.calls.append(("generate", len(prompts), rows))
    tokens = [self._tokens(p) for p in prompts]
    return standard_step.Completions(
      prompt_ids=np.array([[PAD, 5, 6]] * len(prompts)),
      tokens=tokens,
      text=[" ".join(map(str, t)) for t in tokens],
      logprobs=[np.array([-0.1 * (k + 1) for k in range(len(t))]) for t in tokens],
    )

  def reference_logps(self, prompt_ids, completion_ids, rows):
    self.calls.append(("reference", len(prompt_ids), rows))
    return np.full(completion_ids.shape, -1.0, np.float32)

  def old_logps(self, prompt_ids, completion_ids, rows):
    self.calls.append(("old", len(prompt_ids), rows))
    return np.full(completion_ids.shape, -0.2, np.float32)

  def rewards(self, prompts, completions, fields):
    self.fields.append(fields)
    return np.array([len(c.split()) for c in completions], np.float32)

  def advantages(self, rewards):
    groups = np.asarray(rewards).reshape(-1, G)
    return (groups - groups.mean(axis=1, keepdims=True)).reshape(-1)

  def log(self, values):
    self.logged.update({k: v[0] for k, v in values.items()})

  def episodes(self, episodes, rewards, step):
    self.handed.append((list(episodes), np.asarray(rewards).tolist(), step))


def _shape(**changes) -> shaping.Shaping:
  base = shaping.Shaping(
    dynamic_sampling_rounds=1,
    overlong_buffer_length=0,
    overlong_penalty=1.0,
    max_response_length=WIDTH,
    mask_truncated_completions=False,
    sampler_is=False,
    sampler_is_threshold=2.0,
    sampler_logps=True,
  )
  return dataclasses.replace(base, **changes)


def _step(shape, sampler, reserve=None, **settings):
  values = dict(
    generations=G, reference=False, old=False, width=WIDTH, pad=PAD, eos=EOS, sample_prompts=None, score_prompts=None
  )
  return standard_step.StandardStep(standard_step.StepSettings(**{**values, **settings}), shape, sampler, reserve)


def _prompts(*names):
  return {"prompts": np.repeat(np.array(names), G), "answer": np.repeat(np.arange(len(names)), G)}


def test_a_round_lays_out_the_batch_and_scores_what_the_settings_ask():
  sampler = _Sampler()
  step = _step(_shape(), sampler, reference=True, old=True, sample_prompts=1, score_prompts=2)
  batch = step.batch(_prompts("p0", "p1"), step=0)
  # p0 -> [2, 3, EOS], p1 -> [3, 4]; right-padded to WIDTH
  assert np.asarray(batch.completion_ids).tolist() == [[2, 3, EOS, PAD]] * 2 + [[3, 4, PAD, PAD]] * 2
  assert np.asarray(batch.completion_mask).tolist() == [[1, 1, 1, 0]] * 2 + [[1, 1, 0, 0]] * 2
  assert np.asarray(batch.prompt_mask).tolist() == [[False, True, True]] * 4
  assert np.allclose(batch.sampler_logps, [[-0.1, -0.2, -0.3, 0]] * 2 + [[-0.1, -0.2, 0, 0]] * 2)
  # sampling calls take 1 prompt (G rows), scoring calls 2 prompts
  assert sampler.calls == [("generate", 4, 2), ("reference", 4, 4), ("old", 4, 4)]
  assert np.asarray(batch.ref_logps).tolist() == [[-1.0] * WIDTH] * 4
  assert batch.sampler_is_weights is None
  assert np.asarray(batch.advantages).tolist() == [0, 0, 0, 0]  # each group's rewards are equal
  assert sampler.fields == [{"answer": pytest.approx([0, 0, 1, 1])}]
  assert sampler.logged["rewards/score/mean"] == pytest.approx(2.5)
  assert sampler.logged["completions/max_length"] == 3
  # each row is an episode, handed on once with the reward it trains with
  [(episodes, rewards, at)] = sampler.handed
  assert at == 0 and rewards == [3, 3, 2, 2]
  assert [e.group_id for e in episodes] == ["0:0", "0:0", "0:1", "0:1"]
  first = episodes[0]
  assert first.prompt_ids.tolist() == [5, 6]  # without its left padding
  assert first.completion_ids.tolist() == [2, 3, EOS] and first.completion_mask.tolist() == [1, 1, 1]
  assert np.allclose(first.logprobs, [-0.1, -0.2, -0.3]) and first.version == 0 and not first.failed
  assert first.conversation == [{"role": "user", "content": "p0"}, {"role": "assistant", "content": "2 3 9"}]
  assert first.example["answer"] == 0 and episodes[2].example["prompts"] == "p1"


def test_a_sampled_pad_token_ends_its_episode_masked_as_padding():
  class PadEnds(_Sampler):
    def _tokens(self, prompt):
      return [4, PAD]

  sampler = PadEnds()
  batch = _step(_shape(), sampler).batch(_prompts("p0"), step=5)
  assert np.asarray(batch.completion_mask).tolist() == [[1, 0, 0, 0]] * 2
  [(episodes, _, at)] = sampler.handed
  assert at == 5 and [e.completion_mask.tolist() for e in episodes] == [[1, 0]] * 2
  assert [e.group_id for e in episodes] == ["5:0", "5:0"] and episodes[0].version == 5


def test_nothing_is_scored_unless_asked():
  sampler = _Sampler()
  batch = _step(_shape(), sampler).batch(_prompts("p0"), step=0)
  assert [c[0] for c in sampler.calls] == ["generate"]
  assert batch.ref_logps is None and batch.old_logps is None


def test_the_overlong_penalty_is_added_to_the_rewards():
  sampler = _Sampler()
  step = _step(_shape(overlong_buffer_length=2, overlong_penalty=1.0), sampler)
  batch = step.batch(_prompts("p0", "p1"), step=0)
  # 3 tokens of a budget of 4 with a buffer of 2: -0.5; 2 tokens: 0
  assert sampler.logged["rewards/overlong_penalty"] == pytest.approx(-0.25)
  assert sampler.logged["rewards/score/mean"] == pytest.approx((2.5 * 2 + 2 * 2) / 4)
  assert np.asarray(batch.advantages).tolist() == [0, 0, 0, 0]


def test_dynamic_sampling_keeps_the_reserve_groups_that_vary():
  """Round 0's groups (p0, p1) have equal rewards; the reserve batch's first group gets one short
  completion, so its rewards vary: the batch is that group and, to fill it, the first group without
  signal (p0's), in sampling order."""
  drawn = []

  def reserve(i):
    drawn.append(i)
    return {"prompts": np.array(["r0-1", "r0-2"]), "answer": np.array([7, 8])}

  class _PerRow(_Sampler):
    short = True

    def _tokens(self, prompt):  # the reserve's first group: one short completion, then the usual
      if prompt == "r0-1" and self.short:
        self.short = False
        return [1]
      return super()._tokens(prompt)

  sampler = _PerRow()
  batch = _step(_shape(dynamic_sampling_rounds=2), sampler, reserve).batch(_prompts("p0", "p1"), step=3)
  assert drawn == [3]  # step 3's one reserve batch
  assert sampler.fields[1]["trajectory_ids"] == ["6_0", "6_1", "7_0", "7_1"]
  ids = np.asarray(batch.completion_ids).tolist()
  assert ids == [[2, 3, EOS, PAD], [2, 3, EOS, PAD], [1, PAD, PAD, PAD], [3, 4, PAD, PAD]]
  assert np.asarray(batch.advantages).tolist() == [0, 0, -0.5, 0.5]
  assert np.allclose(batch.sampler_logps[2], [-0.1, 0, 0, 0])
  assert sampler.logged["dynamic_sampling/rounds"] == 2
  assert sampler.logged["dynamic_sampling/short"] == 1  # 1 varied group of the 2 wanted
  # the episodes handed on are the batch's rows: p0's group (round 0's first) and the reserve's first
  [(episodes, rewards, _)] = sampler.handed
  assert [e.group_id for e in episodes] == ["3:0", "3:0", "3:2", "3:2"]
  assert [e.completion_ids.tolist() for e in episodes] == [[2, 3, EOS], [2, 3, EOS], [1], [3, 4]]
  assert rewards == [3, 3, 1, 2]


def test_sampler_importance_weights_and_truncated_completions():
  sampler = _Sampler()
  shape = _shape(sampler_is=True, sampler_is_threshold=0.95, mask_truncated_completions=True)
  batch = _step(shape, sampler, width=2).batch(_prompts("p1"), step=0)
  assert ("old", 2, 2) in sampler.calls  # scored for the weights though num_iterations is 1
  # min(exp(old - sampler), 0.95) per token: exp(-0.2 + 0.1), and exp(0) = 1 cut to 0.95
  assert np.allclose(batch.sampler_is_weights, [[np.exp(-0.1), 0.95]] * 2, atol=1e-6)
  # p1's completion [3, 4] fills the budget of 2 tokens without EOS: truncated, masked
  assert np.asarray(batch.completion_mask).tolist() == [[0, 0]] * 2
  assert sampler.logged["completions/masked_truncated_fraction"] == 1.0
  [(episodes, _, _)] = sampler.handed
  assert [e.completion_mask.tolist() for e in episodes] == [[0, 0]] * 2 and not episodes[0].failed


def test_a_learner_that_computes_its_own_advantages_gets_the_rewards_as_the_functions_returned_them():
  """PPO's learner (its advantages come later, from a critic: services.advantages gives None): the
  batch carries each completion's reward unrounded, fractional ones included."""

  class Fractional(_Sampler):
    def rewards(self, prompts, completions, fields):
      return np.array([0.37, -1.25, 2.5e-3, 7.0], np.float64)

    def advantages(self, rewards):
      return None

  batch = _step(_shape(), Fractional()).batch(_prompts("p0", "p1"), step=0)
  assert batch.advantages is None
  assert batch.rewards.tolist() == [0.37, -1.25, 2.5e-3, 7.0]
