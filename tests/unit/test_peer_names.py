"""The peers' names of our keys: each table entry is a real key of that peer and names real keys of
ours, and a config written with a peer's names is refused saying what each key is here, every
problem of the config in one refusal, one per line."""

import dataclasses
import os
import re

import pytest
import trl
from tunix.rl import rl_cluster
from tunix.rl.agentic import agentic_grpo_learner
from tunix.rl.grpo import grpo_learner
from tunix.rl.ppo import ppo_learner
from tunix.rl.rollout import base_rollout

from maxtext.configs import config_yml, maxtext_keys, peer_names, pyconfig
from tests.conftest import make_config

OURS = {key for key, _, _ in pyconfig.reference()}


def _fields(*classes) -> set[str]:
  return {f.name for c in classes for f in dataclasses.fields(c)}


def test_each_peer_key_is_the_peers_and_not_ours():
  peers = {
    "TRL": _fields(trl.GRPOConfig, trl.ModelConfig),
    "Tunix": _fields(
      grpo_learner.GRPOConfig,
      agentic_grpo_learner.GRPOConfig,
      ppo_learner.PPOConfig,
      base_rollout.RolloutConfig,
      rl_cluster.RLTrainingConfig,
    ),
  }
  for peer, fields in peers.items():
    assert sorted(set(peer_names.PEER_NAMES[peer]) - fields) == [], peer
  for peer, names in peer_names.PEER_NAMES.items():
    assert sorted(set(names) & OURS) == [], peer


def test_each_meaning_names_keys_of_ours():
  for peer, names in peer_names.PEER_NAMES.items():
    for key, ours in names.items():
      if ours.startswith("nothing"):
        continue
      first = re.split(r"[ =,]", ours)[0]
      assert first in OURS, (peer, key, ours)


@pytest.mark.parametrize(
  "arg, says",
  [
    ("beta=0.1", "beta: unknown key (command line); TRL's and Tunix's beta is rl.grpo_beta here"),
    ("max_completion_length=64", "TRL's max_completion_length is max_response_length here"),
    ("temperature=0.7", "temperature is decode_sampling_temperature here"),
    ("max_steps=3", "TRL's and Tunix's max_steps is num_batches here"),
    ("kv_cache_size=3", "Tunix's kv_cache_size has no counterpart here: the cache holds"),
    ("loss_type=dapo", "TRL's loss_type is rl.loss_agg_mode with rl.advantage_estimator here"),
    ("steps=5", "MaxText's steps is num_batches here"),
  ],
)
def test_a_peers_key_is_refused_with_what_it_is_here(arg, says):
  with pytest.raises(pyconfig.ConfigError) as e:
    make_config(arg)
  assert says in str(e.value) and "did you mean" not in str(e.value)


def test_every_problem_of_a_config_in_one_refusal_one_per_line():
  with pytest.raises(pyconfig.ConfigError) as e:
    make_config("beta=0.1", "rl.num_generations=four", "learning_rat=1", "use_pathways=true")
  lines = str(e.value).splitlines()
  assert lines[0] == "4 problems:"
  assert lines[1] == "  beta: unknown key (command line); TRL's and Tunix's beta is rl.grpo_beta here"
  assert lines[2] == "  learning_rat: unknown key (command line); did you mean learning_rate?"
  assert lines[3] == "  rl.num_generations='four' (command line): expected int, got string"
  assert lines[4].startswith("  MaxText keys that only tune what this program does not run")


def test_maxtexts_token_and_profiler_keys_load_under_maxtext_compat_with_the_token_redacted(tmp_path):
  args = ("hf_access_token=hf_secret123", "profiler=xplane", "profiler_steps=2")
  with pytest.raises(pyconfig.ConfigError, match=r"unless maxtext_compat=true.*hf_access_token"):
    make_config(*args)
  cfg = make_config(*args, "maxtext_compat=true")
  assert cfg.maxtext_only == {
    "hf_access_token": maxtext_keys.REDACTED,
    "profiler": "xplane",
    "profiler_steps": 2,
  }
  written = tmp_path / "config.yml"
  config_yml.write_yaml(cfg, str(written))
  assert "hf_secret123" not in written.read_text() and "hf_access_token: <redacted>" in written.read_text()


def test_the_docs_list_every_peer_name():
  page = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "configuration.md")
  section = open(page, encoding="utf-8").read().split("## Coming from TRL or Tunix\n")[1].split("\n## ")[0]
  for peer, names in peer_names.PEER_NAMES.items():
    assert [key for key in names if f"| `{key}` |" not in section] == [], peer


def test_every_out_of_range_key_in_one_refusal():
  with pytest.raises(pyconfig.ConfigError) as e:
    make_config("rl.num_iterations=0", "max_num_checkpoints_to_keep=-1")
  assert str(e.value).splitlines() == [
    "2 problems:",
    "  max_num_checkpoints_to_keep=-1: expected a positive integer",
    "  rl.num_iterations=0: expected a positive integer",
  ]
