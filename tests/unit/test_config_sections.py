"""The run config's typed sections: every base.yml key is one section's field, of its default's type;
sections are frozen; and only the entrypoints and the config package hold the whole config."""

import ast
import dataclasses
import os
import pathlib
import re
import types
import typing

import pytest

from maxtext.configs import pyconfig, run_config, sections
from tests.conftest import make_config

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "maxtext"
# The modules that may hold the whole RunConfig: the entrypoints, the config package, the run folder's
# config.yml writer and the memory estimate (every section shapes some part of it).
WHOLE_CONFIG = {
  "configs/checks.py",
  "configs/cli.py",
  "configs/config_yml.py",
  "configs/pyconfig.py",
  "configs/run_config.py",
  "configs/sections.py",
  "inference/decode.py",
  "inference/serve.py",
  "checkpoint_conversion/to_huggingface.py",
  "checkpoint_conversion/to_maxtext.py",
  "trainers/post_train/rl/train_rl.py",
  "trainers/post_train/rl/training_run.py",
  "trainers/post_train/rl/evaluate_rl.py",
  "trainers/post_train/rl/train_reward_model.py",
  "trainers/post_train/rl/run_folder.py",
  "trainers/post_train/rl/footprint.py",
}
_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}


def test_every_key_is_one_sections_field_of_its_defaults_type():
  defaults = pyconfig.initialize(["x", "base.yml"])
  owners: dict[str, str] = {}
  for name, section in sections.SECTION_TYPES.items():
    hints = typing.get_type_hints(section)
    for field, key in sections.yaml_keys(section).items():
      assert key not in owners, f"{key} is in both {owners[key]} and {name}"
      owners[key] = name
      default = getattr(getattr(defaults, name), field)
      hint = hints[field]
      if typing.get_origin(hint) is typing.Literal:
        assert default in typing.get_args(hint), f"{key}: default {default!r} outside {hint}"
      elif type(default) in _TYPES:
        assert hint is type(default) or (hint is float and type(default) is int), f"{key}: {hint} vs {default!r}"
      elif isinstance(default, tuple):
        assert typing.get_origin(hint) is tuple, f"{key}: {hint} vs {default!r}"
  assert set(owners) == {k for k, _, _ in pyconfig.reference()}  # every key of base.yml, nothing else


def test_sections_are_frozen_and_round_trip_to_the_flat_keys():
  cfg = make_config("rl.tools=[calculator]", "rl.use_agentic_rollout=true", "model_name=qwen3-tiny")
  assert cfg.tools.names == ("calculator",) and cfg.model.decoder_family == "qwen3"
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.train.batch_size = 3  # type: ignore[misc]
  assert isinstance(cfg.model.logical_axis_rules, tuple)
  assert run_config.RunConfig.from_values(cfg.flat()) == dataclasses.replace(cfg, overridden={}, urls={})
  view = cfg.maxtext_view()  # what MaxText-format user code reads as tmvp_config
  assert view.rl.tools == ["calculator"] and view.emb_dim == cfg.model.emb_dim
  with pytest.raises(AttributeError, match="frozen"):
    view.emb_dim = 1


def test_a_key_no_section_claims_is_refused():
  values = make_config().flat()
  with pytest.raises(AssertionError, match=r"in no section of RunConfig: \['orphan'\]"):
    run_config.RunConfig.from_values({**values, "orphan": 1})


def _config_params(tree: ast.AST):
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for arg in node.args.args + node.args.kwonlyargs:
        yield node.name, arg


def test_only_entrypoints_and_the_config_package_hold_the_whole_config():
  """Elsewhere a parameter named cfg or config is annotated with what it is (a section, the decoder's
  ModelConfig, a Tunix config, a dict read back from a run's config.yml), and no module names RunConfig."""
  offenders = []
  for path in sorted(SRC.rglob("*.py")):
    rel = path.relative_to(SRC).as_posix()
    if rel in WHOLE_CONFIG:
      continue
    source = path.read_text()
    tree = ast.parse(source)
    if "RunConfig" in source:
      offenders.append(f"{rel}: names RunConfig")
    for function, arg in _config_params(tree):
      if arg.arg in ("cfg", "config"):
        annotation = ast.unparse(arg.annotation) if arg.annotation else ""
        if not annotation:
          offenders.append(f"{rel}: {function}({arg.arg}: {annotation or 'unannotated'})")
  assert not offenders, "modules that take more than their section(s):\n" + "\n".join(offenders)


def test_mapping_values_are_read_only():
  cfg = make_config(
    "model_name=llama-tiny",
    "rope_scaling={factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192}",
  )
  assert isinstance(cfg.model.rope_scaling, types.MappingProxyType)
  assert cfg.flat()["rope_scaling"]["factor"] == 8.0


def test_an_enumerated_key_refuses_a_value_outside_its_one_list_of_choices():
  choices = sections.choices()
  assert tuple(sections.EVAL_SAMPLING) == choices["eval_sampling_strategy"]  # the table that dispatches it
  assert {"log_level", "dtype", "decoder_family", "answer_format", "rl.kl_loss_mode", "rl.tool_sandbox"} <= set(choices)
  for key, allowed in choices.items():
    shown = ", ".join(a or repr(a) for a in allowed)
    with pytest.raises(pyconfig.ConfigError, match=f"^{re.escape(key)}='bogus': expected one of {re.escape(shown)}$"):
      make_config(f"{key}=bogus")


def test_each_keys_rules_on_its_field_fit_the_keys():
  """A field's metadata (sections.key) names keys that exist and fits its type: every `applies`
  condition is decided by a key of base.yml, bounds sit on numbers (or lists of them), paths on strings; the defaults
  are within every key's choices and bounds."""
  flat = pyconfig.initialize(["x", "base.yml"]).flat()
  for section in sections.SECTION_TYPES.values():
    hints = typing.get_type_hints(section)
    for field in dataclasses.fields(section):
      key = sections.yaml_keys(section)[field.name]
      for when in field.metadata.get("applies", ()):
        assert when.decider in flat and when.decider != key, f"{key}: applies under {when.decider}"
      if field.metadata.get("bounds"):
        assert hints[field.name] in (int, float, tuple[float, ...]), f"{key}: bounds on {hints[field.name]}"
      if field.metadata.get("path"):
        assert hints[field.name] is str, f"{key}: a path of type {hints[field.name]}"
  assert sections.field_problems(flat) == []
  assert set(sections.path_keys("input")) <= set(sections.PATH_KEYS)


def test_every_field_says_what_its_key_means_and_help_shows_it(monkeypatch, capsys):
  """Each field of every section carries its key's meaning (sections.key(doc, ...)); the config
  reference, --help and docs/configuration.md's table take it from there, not from base.yml."""
  from maxtext.configs import cli

  for section in sections.SECTION_TYPES.values():
    for field in dataclasses.fields(section):
      doc = field.metadata.get("doc")
      assert isinstance(doc, str) and doc.strip(), f"{section.__name__}.{field.name}: no doc"
  docs = sections.docs()
  assert {key: meaning for key, _, meaning in pyconfig.reference()} == docs
  assert f"| `rl.tools` | `[]` | {docs['rl.tools']} |" in cli.reference_markdown()  # the field `names`
  monkeypatch.setattr(sections, "docs", lambda: {**docs, "rl.max_turns": "A meaning set on the field."})
  cli.print_help("prog")
  assert "  rl.max_turns = 4\n      A meaning set on the field.\n" in capsys.readouterr().out


@pytest.mark.parametrize(
  ("arg", "message"),
  [
    ("learning_rate=.nan", "learning_rate=nan: expected a finite number > 0"),
    ("adam_b2=1.0", "adam_b2=1.0: expected a number from 0 to below 1"),
    (
      "rl.num_generations=1",
      "rl.num_generations=1 with rl.algorithm=grpo: expected at least 2 (GRPO compares the samples of a prompt; "
      "rl.algorithm=ppo takes 1)",
    ),
    (
      "rl.algorithm=ppo critic.mini_batch_size=3",
      "critic.mini_batch_size=3: expected 0 or a multiple of rl.num_generations=4 that divides the step's 8 "
      "completions (batch_size x rl.num_generations)",
    ),
    (
      "rl.algorithm=ppo num_batches=3 critic.warmup_steps=3",
      "critic.warmup_steps=3: expected fewer than num_batches=3 (the policy trains on no token in the critic's "
      "warmup steps)",
    ),
    (
      "critic.learning_rate=0",
      "critic.learning_rate=0.0: expected a finite number > 0, or -1 (ten times learning_rate)",
    ),
    (
      "critic.learning_rate=.inf",
      "critic.learning_rate=inf: expected a finite number > 0, or -1 (ten times learning_rate)",
    ),
    ("math_verify_timeout=.nan", "math_verify_timeout=nan: expected a positive number of seconds"),
  ],
)
def test_a_value_out_of_its_fields_bounds_is_refused_naming_the_key(arg, message):
  with pytest.raises(pyconfig.ConfigError, match=f"^{re.escape(message)}$"):
    make_config(*arg.split())


def test_a_key_its_mode_ignores_is_refused_with_its_fields_first_failing_condition():
  """eval_interval applies only while evaluating and in standard GRPO: with both failing, the first
  condition on its field gives the reason."""
  ignored = sections.inapplicable({**pyconfig.initialize(["x", "base.yml"]).flat(), "rl.use_agentic_rollout": True})
  assert ignored["eval_interval"] == ("evaluation during training runs in standard GRPO only", "rl.use_agentic_rollout")
  with pytest.raises(pyconfig.ConfigError, match=r"^eval_interval=2: .*\(num_test_batches=0 runs no evaluation\)"):
    make_config("rl.use_agentic_rollout=true", "num_test_batches=0", "eval_interval=2")


# Every integer key, with values below its least (or above its most) that a start refuses.
_OUT_OF_RANGE: dict[str, tuple[int, ...]] = {
  "checkpoint_period": (0,),
  "max_num_checkpoints_to_keep": (0, -1),
  "vocab_size": (0,),
  "emb_dim": (0,),
  "num_decoder_layers": (0,),
  "num_query_heads": (0,),
  "num_kv_heads": (0,),
  "head_dim": (0,),
  "mlp_dim": (0,),
  "sliding_window_size": (-1,),
  "sliding_window_pattern": (-1,),
  "query_pre_attn_scalar": (-1,),
  "max_position_embeddings": (0,),
  "init_weights_seed": (-1, 2**32),
  "lora_rank": (-1,),
  "ici_data_parallelism": (0, -2),
  "ici_fsdp_parallelism": (0,),
  "ici_tensor_parallelism": (0,),
  "data_shuffle_seed": (-1,),
  "math_verify_num_procs": (0,),
  "batch_size": (0,),
  "train_micro_batch_size": (-2,),  # -1 is MaxText's 0 (no accumulation)
  "num_batches": (0, -1),
  "num_epoch": (0,),
  "max_prompt_length": (0,),
  "max_response_length": (0,),
  "max_prefill_predict_length": (0, -2),
  "max_target_length": (0,),
  "decode_sampling_top_k": (-1,),
  "decode_seed": (-1,),
  "rollout_max_batch_size": (0,),
  "decode_steps_per_dispatch": (0,),
  "serve_port": (-1, 65536),
  "serve_max_n": (0,),
  "serve_max_queued": (0,),
  "num_test_batches": (-1,),
  "eval_batch_size": (0, -2),  # -1 is MaxText's batch_size
  "num_eval_passes": (0,),
  "eval_interval": (-1,),
  "rl.num_generations": (0,),  # 1 is refused with rl.algorithm=grpo alone (PPO takes it)
  "rl.num_iterations": (0, -1),
  "rl.dynamic_sampling_max_rounds": (1,),
  "rl.overlong_buffer_length": (-1,),
  "rl.max_concurrency": (0, -1),
  "rl.agent_max_failures": (-1,),
  "rl.agent_port": (-1, 65536),
  "rl.off_policy_steps": (-1,),
  "rl.max_turns": (0,),
  "environment.max_turns": (0,),
  "rl.tool_memory_mb": (0,),
  "rl.tool_output_max_chars": (0,),
  "critic.warmup_steps": (-1,),
  "critic.mini_batch_size": (-1,),
  "reward_model.micro_batch_size": (0,),
  "reward_training.num_prompts": (0,),
  "reward_training.samples_per_prompt": (1,),
  "reward_training.max_pairs_per_prompt": (0,),
  "reward_training.num_steps": (0,),
  "reward_training.pairs_per_step": (0,),
  "reward_training.micro_batch_size": (0,),
}


def test_every_integer_key_has_bounds_on_its_field():
  """A count, size, length or seed key takes only the values its field's bounds allow; the table
  below tries a value out of range of each."""
  integer_keys = set()
  for section in sections.SECTION_TYPES.values():
    hints = typing.get_type_hints(section)
    for f in dataclasses.fields(section):
      if hints[f.name] is int:
        key = sections.yaml_keys(section)[f.name]
        integer_keys.add(key)
        assert f.metadata["bounds"] is not None, f"{key}: an integer key without bounds"
  assert integer_keys == set(_OUT_OF_RANGE)


@pytest.mark.parametrize(
  "key, value", [(key, value) for key, values in _OUT_OF_RANGE.items() for value in values], ids=str
)
def test_an_integer_key_out_of_range_stops_the_start_naming_it(key, value):
  """In the mode that reads the key (agentic keys with rl.use_agentic_rollout=true and a tool):
  key=value and what is expected."""
  mode = ["rl.use_agentic_rollout=true", "rl.tools=[python]"] if key in sections.AGENTIC_ONLY_KEYS else []
  mode += ["rl.algorithm=ppo"] if key in sections.PPO_ONLY_KEYS else []
  mode += [f"reward_model.load_parameters_path={os.path.dirname(__file__)}"] if key.startswith("reward_model.") else []
  with pytest.raises(pyconfig.ConfigError) as raised:
    make_config(*mode, f"{key}={value}")
  lines = [line.strip() for line in str(raised.value).splitlines()]
  # one line; where the key's value derives another's (max_prompt_length, MaxText's length aliases) the
  # refusal lists that one too, one problem per line
  assert any(line.startswith(f"{key}={value}: expected ") for line in lines), lines
  assert len(lines) == 1 or lines[0] == f"{len(lines) - 1} problems:", lines
