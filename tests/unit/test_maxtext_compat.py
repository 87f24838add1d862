"""What MaxText users keep: the config pyconfig.initialize returns answers MaxText's flat attribute
names, and MaxText's reward functions import from where MaxText has them."""

import dataclasses

import pytest

from tests.conftest import make_config


def test_the_config_answers_maxtexts_flat_attribute_names_read_only():
  cfg = make_config("rl.num_generations=8", "reasoning_start_token=<think>")
  assert cfg.reasoning_start_token == "<think>" == cfg.task.reasoning_start_token
  assert cfg.rl.num_generations == 8 == cfg.num_generations == cfg.algorithm.num_generations
  assert cfg.max_target_length == cfg.sampling.max_prompt_length + cfg.sampling.max_response_length
  assert cfg.run.run_name == "rl_gsm8k" and getattr(cfg, "eval_batch_size", -1) == 8  # sections and keys alike
  with pytest.raises(AttributeError, match="config has no key 'reasoning_start_tokn'"):
    cfg.reasoning_start_tokn  # noqa: B018
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.reasoning_start_token = "<t>"  # type: ignore[misc]
  with pytest.raises(AttributeError, match="frozen"):
    cfg.rl.num_generations = 2


def test_maxtexts_utils_rl_scores_a_completion_with_the_config_initialize_returns():
  from maxtext.trainers.post_train.rl import utils_rl

  cfg = make_config()
  right = "<reasoning>6 times 7</reasoning><answer>42</answer>"
  wrong = "<reasoning>guess</reasoning><answer>40</answer> <answer>"
  kwargs = dict(prompts=["q", "q"], completions=[right, wrong], tmvp_config=cfg, answer=["42", "42"])
  assert utils_rl.match_format_exactly(**kwargs) == [3.0, 0.0]
  assert utils_rl.match_format_approximately(**kwargs) == [4 * 0.5, 3 * 0.5 - 0.5]  # <answer> twice
  assert utils_rl.check_answer(**kwargs) == [3.0, 0.5]  # 40 is within 10% of 42
  assert utils_rl.check_numbers(**kwargs) == [3.0, -1.0]
