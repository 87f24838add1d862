"""What MaxText users keep: the config pyconfig.initialize returns answers MaxText's flat attribute
names, MaxText's reward functions import from where MaxText has them, and a MaxText config loads (its
keys that only tune what this program does not run with maxtext_compat=true)."""

import dataclasses
import os
import re

import pytest
import yaml

from maxtext.configs import config_yml, maxtext_keys, pyconfig
from maxtext.trainers.post_train.rl import train_rl
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


# Upstream MaxText's src/maxtext/configs/post_train/rl.yml as of AI-Hypercomputer/maxtext@dc8b0abe68af (August
# 2026; Apache-2.0, its header kept), as a MaxText user brings it.
MAXTEXT_RL = os.path.join(os.path.dirname(__file__), "..", "data", "maxtext_rl.yml")


def _engine_only_keys_of(path: str) -> list[str]:
  return [k for k in config_yml.flatten(yaml.safe_load(open(path))) if maxtext_keys.engine_only_reason(k)]


def test_maxtexts_rl_yml_is_refused_in_one_round_naming_every_engine_only_key_by_reason(capsys):
  assert train_rl.main(["train_rl", MAXTEXT_RL]) == 2
  err = capsys.readouterr().err
  [line] = err.splitlines()
  assert line.startswith("config error: MaxText keys that only tune what this program does not run, refused unless ")
  assert "unknown key" not in line
  keys = _engine_only_keys_of(MAXTEXT_RL)
  assert {"use_pathways", "hbm_utilization_vllm", "decoder_layer_input", "rl.reshard_chunk_size"} <= set(keys)
  for key in keys:
    reason = maxtext_keys.engine_only_reason(key)
    group = line.split(f"[{reason}] ")[1].split("; [")[0]  # the keys listed after their reason
    assert f"{key}=" in group, key


def test_maxtexts_rl_yml_loads_with_maxtext_compat_its_values_meaning_what_they_mean_there(caplog):
  cfg = pyconfig.initialize(["train_rl", MAXTEXT_RL, "maxtext_compat=true"])
  assert cfg.maxtext_only["use_pathways"] is True and cfg.maxtext_only["rl.reshard_chunk_size"] is None
  assert cfg.use_pathways is True and cfg.rl.reshard_chunk_size is None  # MaxText code may read them
  assert set(cfg.maxtext_only) == set(_engine_only_keys_of(MAXTEXT_RL))
  [listing] = [r.getMessage() for r in caplog.records if "maxtext_compat=true accepts" in r.getMessage()]
  assert all(f"{key}=" in listing for key in cfg.maxtext_only)
  # max_target_length is prompt + completion; -1 batch sizes are batch_size and no accumulation; null epsilon_high
  # is grpo_epsilon; custom remat recomputes (nothing is offloaded here); its template is the one shipped here.
  assert (cfg.sampling.max_prompt_length, cfg.sampling.max_response_length) == (256, 1024 - 256)
  assert cfg.eval.eval_batch_size == cfg.train.batch_size == 1 and cfg.train.train_micro_batch_size == 0
  assert cfg.algorithm.epsilon_high == -1.0 and cfg.model.remat_policy == "full"
  assert cfg.task.data_template_path == "gsm8k_rl.json" and cfg.task.reward_functions == ()
  assert cfg.task.math_verify_num_procs == 1 and cfg.data.train_fraction == 1.0  # min(batch_size, CPUs); all rows
  rules = dict(reversed(cfg.model.logical_axis_rules))  # the first rule per logical axis, as sharding reads them,
  # without the mesh axes this mesh lacks
  assert rules["embed"] == ("fsdp",) and rules["mlp"] == ("tensor",) and rules["activation_vocab"] == ("tensor",)
  assert cfg.overridden["remat_policy"] == ("full", f"{os.path.abspath(MAXTEXT_RL)}, MaxText's 'custom'")


def test_config_yml_records_the_accepted_maxtext_keys_and_loads_again(tmp_path):
  cfg = pyconfig.initialize(["train_rl", MAXTEXT_RL, "maxtext_compat=true"])
  path = str(tmp_path / "config.yml")
  config_yml.write_yaml(cfg, path)
  written = yaml.safe_load(open(path))
  assert written["maxtext_compat"] is True and written["use_pathways"] is True
  assert written["rl"]["reshard_chunk_size"] is None and written["hbm_utilization_vllm"] == 0.72
  again = pyconfig.initialize(["train_rl", path])
  assert again.flat() == cfg.flat() and again.maxtext_only == cfg.maxtext_only


def test_keys_maxtext_names_otherwise_are_ours():
  cfg = make_config("decode_sampling_nucleus_p=0.5", "micro_batch_size=1", "batch_size=2", "hf_name=main")
  assert cfg.sampling.decode_sampling_top_p == 0.5 == cfg.decode_sampling_nucleus_p
  assert cfg.train.train_micro_batch_size == 1 and cfg.data.hf_subset == "main"
  cfg = make_config("reward_functions_path=mine.py", "reward_functions=first, second")  # MaxText's comma list
  assert cfg.task.reward_functions == ("first", "second")
  greedy = "generation_configs={greedy: {eval_temperature: 0.01, eval_top_k: 1, eval_top_p: 1.0}}"
  assert make_config(greedy, "enable_checkpointing=true", "stop_strings=null").eval.eval_sampling_strategy == "greedy"


@pytest.mark.parametrize(
  "args, message",
  [
    (
      ["enable_checkpointing=false"],
      "enable_checkpointing=False (command line): not supported, checkpoints are always",
    ),
    (["stop_strings=[</answer>]"], "stop_strings=['</answer>'] (command line): not supported, generation stops at"),
    (
      ["generation_configs.standard.eval_temperature=0.5"],
      "generation_configs.standard={'eval_temperature': 0.5} (command line): eval_sampling_strategy=standard samples",
    ),
    (["maxtext_compat=true"], "maxtext_compat=true: no key of this config needs it"),
    (["logical_axis_rules=[[embed, [fsdp, sharded]]]"], "names mesh axes ['sharded']; expected data, fsdp, tensor"),
    (["remat_policy=minimal"], "remat_policy='minimal': expected one of none, full"),
  ],
)
def test_maxtext_values_this_program_cannot_honour_are_refused(args, message):
  with pytest.raises(pyconfig.ConfigError, match=re.escape(message)):
    make_config(*args)


def test_unknown_keys_refused_values_and_engine_only_keys_are_reported_together():
  with pytest.raises(pyconfig.ConfigError) as e:
    make_config("learning_rat=1", "use_pathways=true", "enable_checkpointing=false", "hbm_utilization_vllm=0.5")
  message = str(e.value)
  lines = message.splitlines()
  assert lines[:2] == ["3 problems:", "  learning_rat: unknown key (command line); did you mean learning_rate?"]
  assert lines[2].startswith("  enable_checkpointing=False (command line): not supported")
  assert "[Pathways and multi-slice launching" in message and "[vLLM rollouts" in message


def test_the_docs_name_every_maxtext_key_this_program_knows():
  page = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "configuration.md")
  section = open(page, encoding="utf-8").read().split("## Coming from MaxText\n")[1].split("\n## ")[0]
  known = [*maxtext_keys.RENAMED, *maxtext_keys.FIXED, *maxtext_keys.MAPPING_VALUED]
  known += [key for keys in maxtext_keys.ENGINE_ONLY.values() for key in keys]
  assert [key for key in known if f"`{key}" not in section] == []
