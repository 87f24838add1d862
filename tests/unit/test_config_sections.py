"""The run config's typed sections: every base.yml key is one section's field, of its default's type;
sections are frozen; and only the entrypoints and the config package hold the whole config."""

import ast
import dataclasses
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
  "checkpoint_conversion/to_huggingface.py",
  "checkpoint_conversion/to_maxtext.py",
  "trainers/post_train/rl/train_rl.py",
  "trainers/post_train/rl/training_run.py",
  "trainers/post_train/rl/evaluate_rl.py",
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
  condition is decided by a key of base.yml, bounds sit on numbers, paths on strings; the defaults
  are within every key's choices and bounds."""
  flat = pyconfig.initialize(["x", "base.yml"]).flat()
  for section in sections.SECTION_TYPES.values():
    hints = typing.get_type_hints(section)
    for field in dataclasses.fields(section):
      key = sections.yaml_keys(section)[field.name]
      for when in field.metadata.get("applies", ()):
        assert when.decider in flat and when.decider != key, f"{key}: applies under {when.decider}"
      if field.metadata.get("bounds"):
        assert hints[field.name] in (int, float), f"{key}: bounds on {hints[field.name]}"
      if field.metadata.get("path"):
        assert hints[field.name] is str, f"{key}: a path of type {hints[field.name]}"
  assert sections.field_problem(flat) is None
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
    ("rl.num_generations=1", "rl.num_generations=1: GRPO needs at least 2 samples per prompt"),
    ("math_verify_timeout=.nan", "math_verify_timeout=nan: expected a positive number of seconds"),
  ],
)
def test_a_value_out_of_its_fields_bounds_is_refused_naming_the_key(arg, message):
  with pytest.raises(pyconfig.ConfigError, match=f"^{re.escape(message)}$"):
    make_config(arg)


def test_a_key_its_mode_ignores_is_refused_with_its_fields_first_failing_condition():
  """eval_interval applies only while evaluating and in standard GRPO: with both failing, the first
  condition on its field gives the reason."""
  ignored = sections.inapplicable({**pyconfig.initialize(["x", "base.yml"]).flat(), "rl.use_agentic_rollout": True})
  assert ignored["eval_interval"] == ("evaluation during training runs in standard GRPO only", "rl.use_agentic_rollout")
  with pytest.raises(pyconfig.ConfigError, match=r"^eval_interval=2: .*\(num_test_batches=0 runs no evaluation\)"):
    make_config("rl.use_agentic_rollout=true", "num_test_batches=0", "eval_interval=2")
