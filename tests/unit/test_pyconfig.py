"""Config precedence, aliases, type checks and unknown keys."""

import os
import re

import pytest
import yaml

from maxtext.configs import config_yml, pyconfig, sections
from tests.conftest import make_config


def test_precedence_base_rl_model_cli():
  cfg = make_config()
  assert cfg.run.run_name == "rl_gsm8k"  # rl.yml over base.yml
  assert cfg.model.model_name == "smollm2-135m" and cfg.model.emb_dim == 576
  cfg = make_config("model_name=qwen3-0.6b")
  assert (
    cfg.model.emb_dim == 1024 and cfg.model.use_qk_norm and cfg.model.decoder_family == "qwen3"
  )  # model YAML over base
  cfg = make_config("model_name=qwen3-0.6b", "emb_dim=512")
  assert cfg.model.emb_dim == 512  # command line over model YAML


def test_bare_file_name_and_base_yml():
  assert make_config(yaml="base.yml").run.run_name == "default_run"
  assert make_config(yaml=os.path.join(pyconfig.CONFIG_DIR, "post_train", "rl.yml")).run.run_name == "rl_gsm8k"


def test_dotted_keys_reach_nested_sections():
  cfg = make_config("rl.num_generations=8", "rl.grpo_beta=0")
  assert cfg.algorithm.num_generations == 8
  assert cfg.algorithm.grpo_beta == 0.0 and isinstance(cfg.algorithm.grpo_beta, float)  # int widens to float


def test_exponent_without_dot_is_a_float():
  assert make_config("learning_rate=1e-6").train.learning_rate == 1e-6


def test_model_alias():
  assert make_config("model=qwen3-tiny").model.model_name == "qwen3-tiny"


@pytest.mark.parametrize(
  "arg, expected",
  [
    ("rl.num_generations=four", "rl.num_generations='four' (command line): expected int, got string"),
    ("learning_rate=fast", "learning_rate='fast' (command line): expected float, got string"),
    ("use_qk_norm=1", "use_qk_norm=1 (command line): expected bool, got int"),
  ],
)
def test_wrong_type_names_key_value_and_type(arg, expected):
  with pytest.raises(pyconfig.ConfigError) as e:
    make_config(arg)
  assert expected in str(e.value)


@pytest.mark.parametrize(
  "arg, message",
  [
    ("rl.num_generatons=4", "rl.num_generatons: unknown key (command line); did you mean rl.num_generations?"),
    ("learning_rat=1", "did you mean learning_rate?"),
    ("rl.grpo_betaa=1", "did you mean rl.grpo_beta?"),
  ],
)
def test_unknown_key_suggests_closest(arg, message):
  with pytest.raises(pyconfig.ConfigError, match="unknown key") as e:
    make_config(arg)
  assert message in str(e.value)


def test_a_recipe_key_ignored_by_a_later_choice_is_reported_not_refused(tmp_path, caplog):
  """The demo recipe sets eval_batch_size; num_test_batches=0 on the command line turns evaluation off:
  the run goes on and says the recipe's key is unused. Set in the same layer, it is still refused."""
  with caplog.at_level("WARNING"):
    cfg = pyconfig.initialize(["x", "rl_times_table.yml", "num_test_batches=0"])
  assert cfg.eval.num_test_batches == 0
  assert "eval_batch_size=50 (from " in caplog.text and "rl_times_table.yml) is not used" in caplog.text
  assert "num_test_batches=0 from command line" in caplog.text
  with pytest.raises(pyconfig.ConfigError, match="eval_batch_size=4: standard GRPO .*num_test_batches=0 runs no"):
    pyconfig.initialize(["x", "rl_times_table.yml", "num_test_batches=0", "eval_batch_size=4"])
  recipe = tmp_path / "mine.yml"
  recipe.write_text("base_config: base.yml\nnum_test_batches: 0\neval_batch_size: 4\n")
  with pytest.raises(pyconfig.ConfigError, match="eval_batch_size=4"):
    pyconfig.initialize(["x", str(recipe)])


def test_unknown_key_in_yaml_names_file(tmp_path):
  bad = tmp_path / "my.yml"
  bad.write_text("base_config: base.yml\nrl:\n  num_generaton: 3\n")
  # base_config resolves next to the file first, then under the configs folder.
  with pytest.raises(pyconfig.ConfigError, match=r"rl.num_generaton: unknown key \(.*my.yml\)"):
    pyconfig.initialize(["x", str(bad)])


def test_unknown_model_lists_known_ones():
  with pytest.raises(pyconfig.ConfigError, match="unknown model; known models: .*qwen3-0.6b.*smollm2-135m"):
    make_config("model_name=gpt5")


def test_length_aliases():
  cfg = make_config("max_prefill_predict_length=100", "max_target_length=300")
  assert (cfg.sampling.max_prompt_length, cfg.sampling.max_response_length) == (100, 200)
  assert cfg.sampling.kv_cache_size == 300
  cfg = make_config("max_prompt_length=64", "max_response_length=32")
  assert cfg.sampling.max_target_length == 96 and cfg.sampling.max_prefill_predict_length == 64


def test_conflicting_length_aliases_are_an_error():
  with pytest.raises(pyconfig.ConfigError, match="conflicts with max_prompt_length"):
    make_config("max_prefill_predict_length=100", "max_prompt_length=50")
  with pytest.raises(pyconfig.ConfigError, match="conflicts with max_response_length"):
    make_config("max_target_length=300", "max_prompt_length=100", "max_response_length=50")


def test_lengths_beyond_model_context():
  with pytest.raises(pyconfig.ConfigError, match="exceeds the context of smollm2-135m"):
    make_config("max_prompt_length=8000", "max_response_length=500")


def test_config_is_frozen_and_round_trips(tmp_path):
  cfg = make_config("rl.num_generations=3")
  with pytest.raises(AttributeError):
    cfg.run.run_name = "x"
  path = tmp_path / "config.yml"
  config_yml.write_yaml(cfg, str(path))
  assert yaml.safe_load(path.read_text())["rl"]["num_generations"] == 3
  assert cfg.overridden["rl.num_generations"] == (3, "command line")


def test_base_yml_holds_values_and_no_meanings():
  """One place per fact: base.yml holds the defaults, the section fields the meanings (no trailing comments)."""
  with open(pyconfig.BASE_YAML, encoding="utf-8") as f:
    lines = f.read().splitlines()
  keyed = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
  assert keyed and not [line for line in keyed if "#" in line]


def test_help_lists_every_key_with_its_fields_meaning(capsys):
  from maxtext.trainers.post_train.rl import train_rl

  assert train_rl.main(["train_rl", "--help"]) == 0
  out = capsys.readouterr().out
  assert out.startswith("usage: python -m maxtext.trainers.post_train.rl.train_rl")
  keys = [k for k, _, _ in pyconfig.reference()]
  defaults = pyconfig.initialize(["x", "base.yml"]).flat()
  assert set(keys) == set(defaults)
  meanings = sections.docs()
  for key, _, meaning in pyconfig.reference():
    assert meaning == meanings[key] and f"\n      {meaning}\n" in out, key
  assert "  rl.max_concurrency = 16\n      Agentic: rollouts in flight at once." in out


def test_docs_hold_the_generated_config_reference():
  from maxtext.configs import cli

  page = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "configuration.md")
  doc = open(page, encoding="utf-8").read()
  block = doc.split("<!-- config-reference:start -->\n")[1].split("<!-- config-reference:end -->")[0]
  assert block == cli.reference_markdown(), "regenerate docs/configuration.md's table: python -m maxtext.configs.cli"
  assert "| `rl.max_concurrency` | `16` | Agentic: rollouts in flight at once. |" in block


def test_train_micro_batch_size_divides_batch_size():
  assert make_config("batch_size=4", "train_micro_batch_size=2").train.train_micro_batch_size == 2
  with pytest.raises(pyconfig.ConfigError, match="train_micro_batch_size=3: expected 0 .* divisor of batch_size=4"):
    make_config("batch_size=4", "train_micro_batch_size=3")


def test_matmul_precision_takes_maxtexts_names_and_refuses_others():
  """matmul_precision reaches the decoder's config as a jax.lax.Precision; a dtype name is refused."""
  import jax

  from maxtext.models.decoder import ModelConfig

  assert ModelConfig.from_config(make_config().model).precision == jax.lax.Precision.DEFAULT
  assert ModelConfig.from_config(make_config("matmul_precision=highest").model).precision == jax.lax.Precision.HIGHEST
  with pytest.raises(
    pyconfig.ConfigError, match="^matmul_precision='float32': expected one of default, high, highest$"
  ):
    make_config("matmul_precision=float32")


def test_attention_takes_maxtexts_choices_and_is_dot_product_on_cpu():
  """attention (autoselected by default) resolves, where the decoder's config is built, to dot_product
  on CPU in either dtype; a value outside MaxText's choices is refused naming them."""
  from maxtext.models.decoder import ModelConfig

  for args in ((), ("dtype=bfloat16",), ("dtype=bfloat16", "attention=dot_product")):
    assert ModelConfig.from_config(make_config(*args).model).attention == "dot_product"
  with pytest.raises(
    pyconfig.ConfigError, match="^attention='flash': expected one of autoselected, dot_product, cudnn_flash$"
  ):
    make_config("attention=flash")


def test_cudnn_flash_is_refused_without_bfloat16_and_off_nvidia_gpus():
  """cuDNN's flash attention takes bfloat16 (the config refuses dtype=float32, naming dtype) on NVIDIA
  GPUs (checking the config against this CPU job refuses it, naming the backend and the choices)."""
  from maxtext.utils import distributed

  with pytest.raises(
    pyconfig.ConfigError, match=r"^attention=cudnn_flash, dtype='float32': .* expected dtype=bfloat16"
  ):
    make_config("attention=cudnn_flash")
  cfg = make_config("attention=cudnn_flash", "dtype=bfloat16")
  with pytest.raises(
    pyconfig.ConfigError,
    match=r"^attention=cudnn_flash: .* NVIDIA GPU, but JAX's backend is cpu; expected one of autoselected, "
    r"dot_product, cudnn_flash",
  ):
    cfg.check(distributed.job())


@pytest.mark.parametrize("platform_version, nvidia", [("cuda 12080", True), ("rocm 60342", False)])
def test_autoselected_attention_is_dot_product_on_an_nvidia_gpu_too(monkeypatch, platform_version, nvidia):
  """On a GPU backend (JAX's backend and platform version stood in for) autoselected is dot_product
  (cuDNN's path is taken only when named); an explicit cudnn_flash is taken on NVIDIA's GPUs and
  refused naming the GPU on another."""
  import types

  import jax
  import jax.extend

  from maxtext.models import attention
  from maxtext.utils import distributed

  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(
    jax.extend.backend, "get_backend", lambda: types.SimpleNamespace(platform_version=platform_version)
  )
  select = lambda *args: attention.select(make_config(*args).model)
  assert select("dtype=bfloat16") == "dot_product"
  assert select() == select("dtype=bfloat16", "attention=dot_product") == "dot_product"
  if nvidia:
    assert select("dtype=bfloat16", "attention=cudnn_flash") == "cudnn_flash"
  else:
    with pytest.raises(pyconfig.ConfigError, match=re.escape(f"JAX's backend is gpu ({platform_version})")):
      make_config("dtype=bfloat16", "attention=cudnn_flash").check(distributed.job())


@pytest.mark.parametrize("key", ["eval_interval", "rl.off_policy_steps"])
def test_negative_count_names_the_key(key):
  assert make_config(f"{key}=0", "rl.use_agentic_rollout=true")
  with pytest.raises(pyconfig.ConfigError, match=f"{key}=-1: expected an integer >= 0"):
    make_config(f"{key}=-1")


def test_unreadable_yaml_names_the_file(tmp_path):
  bad = tmp_path / "bad.yml"
  bad.write_text("rl: [unclosed\n")
  with pytest.raises(pyconfig.ConfigError, match=r"bad.yml: not valid YAML"):
    make_config(yaml=str(bad))


@pytest.mark.parametrize("arg", ["lora_alpha=32", "lora_module_path=layers\\.0\\..*", "lora_input_adapters_path=x"])
def test_lora_keys_are_refused_without_adapters(arg):
  key = arg.split("=")[0]
  unrolled = "scan_layers=false"  # layer 0's adapters only: unrolled layers (scan_layers=true refuses them)
  assert (
    getattr(make_config(arg, "lora_rank=8", unrolled).model, key)
    == pyconfig.initialize(["x", "rl.yml", arg, "lora_rank=8", unrolled]).flat()[key]
  )
  with pytest.raises(pyconfig.ConfigError, match=f"{key}=.*lora_rank=0 trains the full weights"):
    make_config(arg)


@pytest.mark.parametrize(
  "args, message",
  [
    (["lora_rank=-1"], "lora_rank=-1: expected an integer >= 0"),
    (["lora_rank=4", "lora_alpha=0"], "lora_alpha=0.0: expected a number > 0"),
    (["lora_rank=4", "lora_module_path=layers.(("], "lora_module_path='layers.\\(\\(': not a regular expression"),
  ],
)
def test_bad_lora_settings_name_the_key(args, message):
  with pytest.raises(pyconfig.ConfigError, match=message):
    make_config(*args)


@pytest.mark.parametrize("key", sections.PATH_KEYS)
def test_unsupported_url_schemes_are_refused_naming_the_key(key):
  """A path key takes a local path or gs://; another scheme is a config error at start, not a local
  folder named 's3:'."""
  with pytest.raises(
    pyconfig.ConfigError, match=rf"{re.escape(key)}='s3://b/x': s3:// is not supported; expected a local path or gs://"
  ):
    make_config(f"{key}=s3://b/x")


def test_the_compilation_cache_stays_on_the_machine():
  with pytest.raises(pyconfig.ConfigError, match=r"jax_cache_dir='gs://b/c': expected a local folder"):
    make_config("jax_cache_dir=gs://b/c")


@pytest.mark.parametrize(
  "args, message",
  [
    (["rollout_dtype=float16"], "rollout_dtype='float16'.*model, bfloat16"),
    (["rollout_dtype=bfloat16", "rollout_engine=vanilla"], "rollout_dtype='bfloat16': .*only rollout_engine=batched"),
  ],
)
def test_rollout_dtype_is_refused_where_it_would_not_apply(args, message):
  with pytest.raises(pyconfig.ConfigError, match=message):
    make_config(*args)


@pytest.mark.parametrize(
  "arg, expected",
  [
    ("learning_rate=nan", "learning_rate=nan: expected a finite number > 0"),
    ("learning_rate=.inf", "learning_rate=inf: expected a finite number > 0"),
    ("learning_rate=-1", "learning_rate=-1.0: expected a finite number > 0"),
    ("learning_rate=0", "learning_rate=0.0: expected a finite number > 0"),
    ("adam_b1=1", "adam_b1=1.0: expected a number from 0 to below 1"),
    ("adam_b2=nan", "adam_b2=nan: expected a number from 0 to below 1"),
    ("adam_weight_decay=-0.1", "adam_weight_decay=-0.1: expected a finite number >= 0"),
    ("gradient_clipping_threshold=inf", "gradient_clipping_threshold=inf: expected a finite number >= 0"),
    ("warmup_steps_fraction=1", "warmup_steps_fraction=1.0: expected a fraction from 0 to below 1"),
  ],
)
def test_optimizer_hyperparameters_are_finite_and_in_range(arg, expected):
  """A NaN or infinite optimizer setting makes every update non-finite: refused before anything runs."""
  with pytest.raises(pyconfig.ConfigError) as e:
    make_config(arg)
  assert expected in str(e.value)


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "/tmp/x", "a\\b"])
def test_run_name_is_one_folder_name(name):
  """An empty run_name made base_output_directory itself the run folder; a path escaped it."""
  assert make_config("run_name=a.b-c_1").run.run_name == "a.b-c_1"
  with pytest.raises(pyconfig.ConfigError, match=rf"run_name={re.escape(repr(name))}: expected the name of one folder"):
    make_config(f"run_name={name}")


@pytest.mark.parametrize(
  "args, message",
  [
    (
      ["rl.advantage_estimator=vibes"],
      "rl.advantage_estimator='vibes': expected one of grpo, dr_grpo, rloo, reinforce_pp",
    ),
    (["rl.policy_loss_fn=cispo", "rl.loss_algo=gspo-token"], "sequence-level ratio belongs to ppo_clip"),
    (["dataset_name=random_digit", "reward_exact_answer=2.0"], "reward_exact_answer: dataset_name=random_digit would"),
    (["reward_functions=[mine]"], "reward_functions: set reward_functions_path to the file that defines them"),
    (["reward_functions_path=mine.py"], "reward_functions: name the functions of mine.py to use"),
  ],
)
def test_initialize_refuses_whatever_the_command_line_refuses_of_the_config(args, message):
  """pyconfig.initialize, the programmatic entry, returns only configs the programs run with: no check of the
  config's own values waits for train_rl."""
  with pytest.raises(pyconfig.ConfigError, match=re.escape(message)):
    make_config(*args)
