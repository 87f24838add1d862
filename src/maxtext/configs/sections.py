"""The run config as typed, frozen sections: each component receives the section(s) it reads.

base.yml stays flat (MaxText's keys) and the single source of defaults; every one of its keys is a
field of exactly one section (`RunConfig.from_values` refuses a key no section claims). A field's
key is its section's PREFIX plus the field name, or the key its metadata names. Lists become tuples
and mappings read-only, so a section can be shared without being changed.

A key's own rules live on its field: its choices (a Literal type) and, as metadata that `key(...)`
builds, its bounds, what a file or folder it names is to the run (`path`) and when the run reads it
at all (`applies`: conditions on other keys). `field_problem(values)` checks the choices and bounds
of every key at once, `inapplicable(values)` the conditions; configs/checks.py holds the rules that
relate keys.

User code written for MaxText (reward functions, dataset processors) keeps its `tmvp_config`: the
flat attribute view `RunConfig.maxtext_view()`, which RunConfig itself answers too (cfg.reasoning_start_token,
cfg.rl.num_generations), for MaxText code that holds what pyconfig.initialize returns.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from maxtext.configs import maxtext_keys
from maxtext.utils import storage

# The values an enumerated key takes: the one list of its choices, which pyconfig checks at start
# (naming the key, the value and these) and the code that dispatches on it is typed with.
LogLevel = Literal["debug", "info", "warning", "error"]
Dtype = Literal["float32", "bfloat16"]
RematPolicy = Literal["none", "full"]
MatmulPrecision = Literal["default", "high", "highest"]
ChatTemplate = Literal["model", "plain"]
Attention = Literal["autoselected", "dot_product", "cudnn_flash"]
DecoderFamily = Literal["llama", "qwen3", "gemma3"]
AnswerFormat = Literal["tags", "last_number"]
RolloutEngineName = Literal["batched", "vanilla"]
RolloutDtype = Literal["model", "bfloat16"]
EvalStrategy = Literal["greedy", "standard", "liberal"]
EvalMode = Literal["pass", "maj", "pass_at_1"]
KlLossMode = Literal["low_var_kl", "mse_kl", "kl"]
# The algorithm's registries (integration/tunix/losses.py) hold one entry per choice.
AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
PolicyLossFn = Literal["ppo_clip", "cispo"]
LossAlgo = Literal["grpo", "gspo-token"]  # the ratio of ppo_clip: per token, or the sequence's (GSPO)
# The modes tunix.rl.common.aggregate_loss implements (a contract test checks them).
LossAggMode = Literal[
  "token-mean",
  "sequence-mean-token-mean",
  "sequence-mean-token-scale",
  "seq-mean-token-sum",
  "sequence-mean-token-sum-norm",
]
SamplerIS = Literal["", "token"]
ToolSandbox = Literal["bwrap", "none"]


@dataclasses.dataclass(frozen=True)
class When:
  """A condition on the config under which a key takes effect: `holds(values)` on dotted key -> value.
  Where it does not hold the run ignores the key; `reason` (a string, or one made from the values)
  says why and `decider` names the key whose value makes it so."""

  decider: str
  holds: Callable[[Mapping[str, Any]], bool]
  reason: str | Callable[[Mapping[str, Any]], str]

  def because(self, reason: str) -> When:
    """The same condition, with a reason of its own for one key."""
    return dataclasses.replace(self, reason=reason)

  def why_not(self, values: Mapping[str, Any]) -> str | None:
    """Why a key under this condition is ignored with `values`, or None where it holds."""
    if self.holds(values):
      return None
    return self.reason if isinstance(self.reason, str) else self.reason(values)


# The conditions keys take effect under (`key(applies=...)`).
AGENTIC = When("rl.use_agentic_rollout", lambda v: v["rl.use_agentic_rollout"], "only agentic GRPO reads it")
STANDARD = When("rl.use_agentic_rollout", lambda v: not v["rl.use_agentic_rollout"], "only standard GRPO reads it")
EVALUATING = When("num_test_batches", lambda v: v["num_test_batches"] != 0, "num_test_batches=0 runs no evaluation")
LORA = When("lora_rank", lambda v: v["lora_rank"] != 0, "lora_rank=0 trains the full weights, without adapters")
TAG_REWARDS = When(
  "answer_format",
  lambda v: v["answer_format"] != "last_number",
  "answer_format=last_number rewards the last number only",
)
BATCHED_ENGINE = When("rollout_engine", lambda v: v["rollout_engine"] == "batched", "only rollout_engine=batched")
ANY_TOOL = When(
  "rl.tools", lambda v: bool(v["rl.tools"]), lambda v: f"no tool it limits is in rl.tools={v['rl.tools']}"
)
PYTHON_TOOL = dataclasses.replace(ANY_TOOL, holds=lambda v: "python" in v["rl.tools"])
DYNAMIC_SAMPLING = When("rl.dynamic_sampling", lambda v: v["rl.dynamic_sampling"], "rl.dynamic_sampling=false")
OVERLONG_BUFFER = When(
  "rl.overlong_buffer_length",
  lambda v: v["rl.overlong_buffer_length"] != 0,
  "rl.overlong_buffer_length=0 punishes nothing",
)
SAMPLER_IS = When("rl.sampler_is", lambda v: bool(v["rl.sampler_is"]), "rl.sampler_is is off")


@dataclasses.dataclass(frozen=True)
class Bound:
  """The values a number key takes: those `ok` accepts (finite ones only, where `finite`); the error
  for any other reads "{key}={value}: {expected}"."""

  ok: Callable[[Any], bool]
  expected: str
  finite: bool = False

  def problem(self, dotted: str, value: Any) -> str | None:
    """The error for `value` of the key `dotted`, or None where it is in bounds."""
    if (not self.finite or math.isfinite(value)) and self.ok(value):
      return None
    return f"{dotted}={value}: {self.expected}"


POSITIVE_INT = Bound(lambda x: x > 0, "expected a positive integer")
NON_NEGATIVE_INT = Bound(lambda x: x >= 0, "expected an integer >= 0")
BELOW_ONE = Bound(lambda x: 0 <= x < 1, "expected a number from 0 to below 1", finite=True)
NON_NEGATIVE = Bound(lambda x: x >= 0, "expected a finite number >= 0", finite=True)


# What a key that names a file or folder is to the run: an input it reads (from a local copy when it is on
# a bucket, see pyconfig.with_local_inputs), an input Orbax reads where it is, or where it writes.
PathKind = Literal["input", "in_place", "output"]


def key(
  name: str | None = None,
  *,
  bounds: Bound | None = None,
  applies: tuple[When, ...] = (),
  path: PathKind | None = None,
) -> dict[str, Any]:
  """A field's metadata (`dataclasses.field(metadata=key(...))`): `name`, its YAML key after the
  section's PREFIX where that is not the field's name; `bounds`, the values it takes; `applies`, the
  conditions under which the run reads the key, the first that fails giving the reason it is ignored;
  `path`, what the file or folder the key names is to the run (a local path or gs://, checked at start)."""
  out: dict[str, Any] = {"applies": applies, "bounds": bounds, "path": path}
  if name is not None:
    out["key"] = name
  return out


@dataclasses.dataclass(frozen=True)
class RunSection:
  """Where the run writes and how it reports."""

  PREFIX: ClassVar[str] = ""
  run_name: str
  base_output_directory: str = dataclasses.field(metadata=key(path="output"))
  log_level: LogLevel
  jax_cache_dir: str = dataclasses.field(metadata=key(path="output"))
  export_hf: bool
  hf_output_path: str = dataclasses.field(metadata=key(path="output"))
  wandb_project: str
  checkpoint_period: int = dataclasses.field(metadata=key(bounds=POSITIVE_INT))
  max_num_checkpoints_to_keep: int
  resume_with_changes: bool
  maxtext_compat: bool

  @property
  def run_dir(self) -> str:
    """base_output_directory/run_name: absolute, as Orbax needs (a relative base_output_directory is
    under the working directory), or a gs:// URL."""
    return storage.join(self.base_output_directory, self.run_name)


@dataclasses.dataclass(frozen=True)
class ModelSection:
  """The decoder's architecture, its weights, tokenizer, LoRA adapters and the logical-axis rules that
  shard its parameters."""

  PREFIX: ClassVar[str] = ""
  model_name: str
  decoder_family: DecoderFamily
  vocab_size: int
  emb_dim: int
  num_decoder_layers: int
  num_query_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_max_timescale: float
  rope_scaling: Mapping[str, float] | None
  rope_local_max_timescale: float
  sliding_window_size: int
  sliding_window_pattern: int
  query_pre_attn_scalar: int
  normalization_layer_epsilon: float
  use_qk_norm: bool
  logits_via_embedding: bool
  max_position_embeddings: int
  dtype: Dtype
  weight_dtype: Dtype
  remat_policy: RematPolicy
  matmul_precision: MatmulPrecision
  attention: Attention
  scan_layers: bool
  load_parameters_path: str = dataclasses.field(metadata=key(path="input"))
  tokenizer_path: str = dataclasses.field(metadata=key(path="input"))
  chat_template: ChatTemplate
  init_weights_seed: int
  random_weights: bool
  lora_rank: int
  lora_alpha: float = dataclasses.field(metadata=key(applies=(LORA,)))
  lora_module_path: str = dataclasses.field(metadata=key(applies=(LORA,)))
  lora_input_adapters_path: str = dataclasses.field(metadata=key(path="in_place", applies=(LORA,)))
  logical_axis_rules: tuple[tuple[str, tuple[str, ...]], ...]


# The device mesh's axes, in the order of its shape.
MESH_AXES = ("data", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class MeshSection:
  """Devices: mesh axes and the trainer/sampler split."""

  PREFIX: ClassVar[str] = ""
  ici_data_parallelism: int
  ici_fsdp_parallelism: int
  ici_tensor_parallelism: int
  trainer_devices_fraction: float
  sampler_devices_fraction: float


@dataclasses.dataclass(frozen=True)
class DataSection:
  """Where the questions come from and how they are split."""

  PREFIX: ClassVar[str] = ""
  dataset_name: str = dataclasses.field(metadata=key(path="input"))
  eval_dataset_name: str = dataclasses.field(metadata=key(path="input", applies=(EVALUATING,)))
  hf_subset: str
  tfds_data_dir: str = dataclasses.field(metadata=key(path="input"))
  train_split: str
  eval_split: str = dataclasses.field(metadata=key(applies=(EVALUATING,)))
  train_fraction: float = dataclasses.field(
    metadata=key(bounds=Bound(lambda x: 0.0 < x <= 1.0, "expected a fraction above 0, at most 1"))
  )
  dataset_processor_path: str = dataclasses.field(metadata=key(path="input"))
  data_shuffle_seed: int


# The shipped data templates, which data_template_path may name by file name.
TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


@dataclasses.dataclass(frozen=True)
class TaskSection:
  """How a question becomes a prompt and a completion a reward: template, answer format, weights."""

  PREFIX: ClassVar[str] = ""
  data_template_path: str = dataclasses.field(metadata=key(path="input"))
  answer_format: AnswerFormat
  reasoning_start_token: str
  reasoning_end_token: str
  solution_start_token: str
  solution_end_token: str
  reasoning_start_token_in_prompt: bool
  reward_exact_format_match: float = dataclasses.field(metadata=key(applies=(TAG_REWARDS,)))
  reward_white_space_format_match: float = dataclasses.field(metadata=key(applies=(TAG_REWARDS,)))
  reward_partial_format_match: float = dataclasses.field(metadata=key(applies=(TAG_REWARDS,)))
  reward_ratio_guess_to_answer_high: float = dataclasses.field(metadata=key(applies=(TAG_REWARDS,)))
  reward_ratio_guess_to_answer_low: float = dataclasses.field(metadata=key(applies=(TAG_REWARDS,)))
  reward_exact_answer: float
  penalty_incorrect_format: float = dataclasses.field(metadata=key(applies=(TAG_REWARDS,)))
  penalty_incorrect_answer: float = dataclasses.field(metadata=key(applies=(TAG_REWARDS,)))
  math_verify_timeout: float = dataclasses.field(
    metadata=key(bounds=Bound(lambda x: x > 0, "expected a positive number of seconds"))
  )
  math_verify_num_procs: int = dataclasses.field(metadata=key(bounds=POSITIVE_INT))
  reward_functions_path: str = dataclasses.field(metadata=key(path="input"))
  reward_functions: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class TrainSection:
  """Steps, batches and the optimizer."""

  PREFIX: ClassVar[str] = ""
  batch_size: int = dataclasses.field(metadata=key(bounds=POSITIVE_INT))
  train_micro_batch_size: int
  num_batches: int = dataclasses.field(metadata=key(bounds=POSITIVE_INT))
  num_epoch: int = dataclasses.field(metadata=key(bounds=POSITIVE_INT))
  learning_rate: float = dataclasses.field(
    metadata=key(bounds=Bound(lambda x: x > 0, "expected a finite number > 0", finite=True))
  )
  warmup_steps_fraction: float = dataclasses.field(
    metadata=key(bounds=Bound(lambda x: 0 <= x < 1, "expected a fraction from 0 to below 1", finite=True))
  )
  adam_b1: float = dataclasses.field(metadata=key(bounds=BELOW_ONE))
  adam_b2: float = dataclasses.field(metadata=key(bounds=BELOW_ONE))
  adam_weight_decay: float = dataclasses.field(metadata=key(bounds=NON_NEGATIVE))
  adam_weight_decay_all: bool
  gradient_clipping_threshold: float = dataclasses.field(
    metadata=key(bounds=Bound(lambda x: x >= 0, "expected a finite number >= 0 (0: no clipping)", finite=True))
  )


@dataclasses.dataclass(frozen=True)
class SamplingSection:
  """Rollouts: lengths, sampling parameters and the engine."""

  PREFIX: ClassVar[str] = ""
  max_prompt_length: int = dataclasses.field(metadata=key(bounds=POSITIVE_INT))
  max_response_length: int = dataclasses.field(metadata=key(bounds=POSITIVE_INT))
  max_prefill_predict_length: int
  max_target_length: int
  decode_sampling_temperature: float
  decode_sampling_top_p: float
  decode_sampling_top_k: int
  decode_seed: int
  rollout_engine: RolloutEngineName
  rollout_max_batch_size: int = dataclasses.field(
    metadata=key(bounds=POSITIVE_INT, applies=(BATCHED_ENGINE.because("only rollout_engine=batched has decode slots"),))
  )
  decode_steps_per_dispatch: int = dataclasses.field(
    metadata=key(
      bounds=POSITIVE_INT, applies=(BATCHED_ENGINE.because("only rollout_engine=batched decodes chunks on the device"),)
    )
  )
  rollout_dtype: RolloutDtype = dataclasses.field(
    metadata=key(applies=(BATCHED_ENGINE.because("only rollout_engine=batched samples from a copy of the weights"),))
  )
  prompt: tuple[str, ...]
  use_chat_template: bool

  @property
  def kv_cache_size(self) -> int:
    """Slots of the sampler's KV cache: the longest prompt plus the longest response."""
    return self.max_prompt_length + self.max_response_length


# eval_sampling_strategy -> the sampling parameters of evaluation.
EVAL_SAMPLING: dict[EvalStrategy, dict[str, Any]] = {
  "greedy": {"temperature": 0.0, "top_p": None, "top_k": None},
  "standard": {"temperature": 0.7, "top_p": 0.95, "top_k": 50},
  "liberal": {"temperature": 0.85, "top_p": 1.0, "top_k": 2000},
}


@dataclasses.dataclass(frozen=True)
class EvalSection:
  """Evaluation before, during and after training."""

  PREFIX: ClassVar[str] = ""
  num_test_batches: int = dataclasses.field(
    metadata=key(bounds=Bound(lambda x: x >= 0, "expected 0 (no evaluation) or a positive integer"))
  )
  eval_batch_size: int = dataclasses.field(metadata=key(bounds=POSITIVE_INT, applies=(EVALUATING,)))
  eval_sampling_strategy: EvalStrategy = dataclasses.field(metadata=key(applies=(EVALUATING,)))
  num_eval_passes: int = dataclasses.field(metadata=key(bounds=POSITIVE_INT, applies=(EVALUATING,)))
  eval_mode: EvalMode = dataclasses.field(metadata=key(applies=(EVALUATING,)))
  eval_interval: int = dataclasses.field(
    metadata=key(
      bounds=NON_NEGATIVE_INT,
      applies=(EVALUATING, STANDARD.because("evaluation during training runs in standard GRPO only")),
    )
  )
  eval_make_lst: bool = dataclasses.field(metadata=key(applies=(EVALUATING,)))


@dataclasses.dataclass(frozen=True)
class AlgorithmSection:
  """GRPO and its variants: group size, advantages, the policy loss, KL, sampler correction, shaping."""

  PREFIX: ClassVar[str] = "rl."
  num_generations: int = dataclasses.field(
    metadata=key(bounds=Bound(lambda x: x >= 2, "GRPO needs at least 2 samples per prompt"))
  )
  num_iterations: int = dataclasses.field(
    metadata=key(applies=(STANDARD.because("its learner trains each batch once"),))
  )
  grpo_beta: float
  kl_loss_mode: KlLossMode
  grpo_epsilon: float
  advantage_estimator: AdvantageEstimator
  policy_loss_fn: PolicyLossFn
  loss_algo: LossAlgo
  loss_agg_mode: LossAggMode
  epsilon_high: float
  sampler_is: SamplerIS = dataclasses.field(
    metadata=key(applies=(BATCHED_ENGINE.because("only the batched engine returns sampler log-probs"),))
  )
  sampler_is_threshold: float = dataclasses.field(
    metadata=key(
      bounds=Bound(lambda x: x >= 1.0, "expected a truncation threshold >= 1 (weights below 1 are never truncated)"),
      applies=(SAMPLER_IS,),
    )
  )
  dynamic_sampling: bool
  dynamic_sampling_max_rounds: int = dataclasses.field(metadata=key(applies=(DYNAMIC_SAMPLING,)))
  overlong_buffer_length: int = dataclasses.field(metadata=key(applies=(STANDARD,)))
  overlong_penalty: float = dataclasses.field(metadata=key(applies=(STANDARD, OVERLONG_BUFFER)))
  mask_truncated_completions: bool = dataclasses.field(metadata=key(applies=(STANDARD,)))
  filter_zero_variance_groups: bool = dataclasses.field(metadata=key(applies=(AGENTIC,)))


@dataclasses.dataclass(frozen=True)
class AgenticSection:
  """Which learner runs, and the agentic learner's concurrency, staleness and system prompt."""

  PREFIX: ClassVar[str] = "rl."
  use_agentic_rollout: bool
  max_concurrency: int = dataclasses.field(metadata=key(applies=(AGENTIC,)))
  off_policy_steps: int = dataclasses.field(metadata=key(bounds=NON_NEGATIVE_INT, applies=(AGENTIC,)))
  system_prompt: str = dataclasses.field(metadata=key(applies=(AGENTIC,)))


@dataclasses.dataclass(frozen=True)
class ToolsSection:
  """The agentic learner's tools and the limits every call runs under."""

  PREFIX: ClassVar[str] = "rl."
  tools_path: str = dataclasses.field(metadata=key(path="input", applies=(AGENTIC,)))
  max_turns: int = dataclasses.field(metadata=key(applies=(AGENTIC, ANY_TOOL)))
  tool_timeout_s: float = dataclasses.field(metadata=key(applies=(AGENTIC, ANY_TOOL)))
  tool_memory_mb: int = dataclasses.field(metadata=key(applies=(AGENTIC, PYTHON_TOOL)))
  tool_output_max_chars: int = dataclasses.field(metadata=key(applies=(AGENTIC, PYTHON_TOOL)))
  tool_sandbox: ToolSandbox = dataclasses.field(metadata=key(applies=(AGENTIC, PYTHON_TOOL)))
  names: tuple[str, ...] = dataclasses.field(metadata=key("tools", applies=(AGENTIC,)))


def _frozen(value: Any) -> Any:
  if isinstance(value, list):
    return tuple(_frozen(v) for v in value)
  if isinstance(value, dict):
    return types.MappingProxyType({k: _frozen(v) for k, v in value.items()})
  return value


def _thawed(value: Any) -> Any:
  if isinstance(value, tuple):
    return [_thawed(v) for v in value]
  if isinstance(value, Mapping):
    return {k: _thawed(v) for k, v in value.items()}
  return value


def yaml_keys(section: Any) -> dict[str, str]:
  """Field name -> dotted base.yml key, for one section class."""
  return {f.name: section.PREFIX + f.metadata.get("key", f.name) for f in dataclasses.fields(section)}


def choices() -> dict[str, tuple[str, ...]]:
  """Dotted key -> its choices, for every key whose field is a Literal."""
  out = {}
  for section in _SECTION_TYPES.values():
    hints = typing.get_type_hints(section)
    for field, key in yaml_keys(section).items():
      if typing.get_origin(hints[field]) is Literal:
        out[key] = typing.get_args(hints[field])
  return out


def _fields() -> list[tuple[str, dataclasses.Field[Any]]]:
  """(dotted key, field) of every section's fields, in section order."""
  out: list[tuple[str, dataclasses.Field[Any]]] = []
  for section in _SECTION_TYPES.values():
    keys = yaml_keys(section)
    out.extend((keys[f.name], f) for f in dataclasses.fields(section))
  return out


def inapplicable(values: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
  """Dotted key -> (why the run ignores it, the key whose value makes it so), for every key one of whose
  `applies` conditions fails with `values` (dotted key -> value): the first one that fails."""
  out = {}
  for dotted, f in _fields():
    for when in f.metadata.get("applies", ()):
      reason = when.why_not(values)
      if reason is not None:
        out[dotted] = (reason, when.decider)
        break
  return out


def field_problem(values: Mapping[str, Any]) -> str | None:
  """The error for the first key, in section order, whose value in `values` (dotted key -> value) is
  not one of its choices (a Literal field) or out of its field's `bounds`; None where none is."""
  allowed = choices()
  for dotted, f in _fields():
    if dotted in allowed and values[dotted] not in allowed[dotted]:
      return f"{dotted}={values[dotted]!r}: expected one of {', '.join(a or repr(a) for a in allowed[dotted])}"
    bounds = f.metadata.get("bounds")
    problem = bounds.problem(dotted, values[dotted]) if bounds else None
    if problem:
      return problem
  return None


def path_keys(*kinds: PathKind) -> tuple[str, ...]:
  """The dotted keys that name a file or folder of one of `kinds` (every kind where none is given)."""
  return tuple(dotted for dotted, f in _fields() if f.metadata.get("path") in (kinds or typing.get_args(PathKind)))


def keys_only_under(when: When) -> tuple[str, ...]:
  """The dotted keys that take effect only under `when`."""
  return tuple(dotted for dotted, f in _fields() if when in f.metadata.get("applies", ()))


class MaxTextView:
  """The flat attribute view MaxText's user code expects (tmvp_config.reward_exact_answer,
  tmvp_config.rl.num_generations, or as MaxText's GRPO trainer once spelt it, tmvp_config.num_generations);
  read-only."""

  def __init__(self, tree: Mapping[str, Any]):
    object.__setattr__(self, "_tree", {k: MaxTextView(v) if isinstance(v, dict) else v for k, v in tree.items()})

  def __getattr__(self, name: str) -> Any:
    try:
      return self._tree[name]
    except KeyError:
      raise AttributeError(f"config has no key {name!r}") from None

  def __setattr__(self, name, value):
    raise AttributeError(f"config is frozen; cannot set {name!r}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The whole run config: only entrypoints and the configs package hold it; components get sections.

  overridden: dotted key -> (value, where it was set) for every key that differs from base.yml;
  urls: dotted key -> the bucket URL of an input replaced by a local copy (config.yml records the URL);
  maxtext_only: dotted key -> value of the MaxText keys that maxtext_compat=true accepted unused
  (config.yml records them).
  """

  run: RunSection
  model: ModelSection
  mesh: MeshSection
  data: DataSection
  task: TaskSection
  train: TrainSection
  sampling: SamplingSection
  eval: EvalSection
  algorithm: AlgorithmSection
  agentic: AgenticSection
  tools: ToolsSection
  overridden: Mapping[str, tuple[Any, str]] = dataclasses.field(default_factory=dict)
  urls: Mapping[str, str] = dataclasses.field(default_factory=dict)
  maxtext_only: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_values(
    cls,
    values: Mapping[str, Any],
    overridden: Mapping[str, tuple[Any, str]] | None = None,
    urls=None,
    maxtext_only: Mapping[str, Any] | None = None,
  ) -> RunConfig:
    """Sections from dotted key -> value (every base.yml key, each claimed by exactly one field)."""
    built: dict[str, Any] = {}
    claimed: set[str] = set()
    for name, section in _SECTION_TYPES.items():
      keys = yaml_keys(section)
      built[name] = section(**{field: _frozen(values[key]) for field, key in keys.items()})
      claimed.update(keys.values())
    unclaimed = sorted(set(values) - claimed)
    if unclaimed:
      raise AssertionError(f"base.yml keys in no section of RunConfig: {unclaimed}")
    return cls(**built, overridden=dict(overridden or {}), urls=dict(urls or {}), maxtext_only=dict(maxtext_only or {}))

  def flat(self) -> dict[str, Any]:
    """Dotted base.yml key -> value (lists and mappings as YAML writes them)."""
    out = {}
    for name, section in _SECTION_TYPES.items():
      part = getattr(self, name)
      out.update({key: _thawed(getattr(part, field)) for field, key in yaml_keys(section).items()})
    return out

  def replace_values(self, changes: Mapping[str, Any], urls: Mapping[str, str]) -> RunConfig:
    """This config with some dotted keys set to other values and their URLs recorded."""
    return RunConfig.from_values({**self.flat(), **changes}, self.overridden, {**self.urls, **urls}, self.maxtext_only)

  def maxtext_view(self) -> MaxTextView:
    """The flat view MaxText-format user code receives as tmvp_config: every key, under MaxText's
    names of renamed ones too, and the MaxText keys maxtext_compat accepted."""
    tree: dict[str, Any] = {}
    flat = self.flat()
    renamed = {theirs: flat[ours] for theirs, ours in maxtext_keys.RENAMED.items()}
    for dotted, value in {**flat, **renamed, **self.maxtext_only}.items():
      node = tree
      *parents, leaf = dotted.split(".")
      for p in parents:
        node = node.setdefault(p, {})
      node[leaf] = value
    tree.update({k: v for k, v in tree["rl"].items() if k not in tree})  # the rl keys' flat spelling too
    return MaxTextView(tree)

  if not typing.TYPE_CHECKING:  # our own code reads the typed sections, and mypy holds it to them

    def __getattr__(self, name: str) -> Any:
      """MaxText's flat attribute names, read-only: cfg.reasoning_start_token, cfg.rl.num_generations."""
      if name.startswith("_"):
        raise AttributeError(name)
      return getattr(self.maxtext_view(), name)


_SECTION_TYPES: dict[str, type] = {
  "run": RunSection,
  "model": ModelSection,
  "mesh": MeshSection,
  "data": DataSection,
  "task": TaskSection,
  "train": TrainSection,
  "sampling": SamplingSection,
  "eval": EvalSection,
  "algorithm": AlgorithmSection,
  "agentic": AgenticSection,
  "tools": ToolsSection,
}

# Keys only agentic GRPO reads (rl.use_agentic_rollout=true), which standard GRPO refuses; and the reverse.
AGENTIC_ONLY_KEYS = keys_only_under(AGENTIC)
STANDARD_ONLY_KEYS = keys_only_under(STANDARD)
# Keys naming a file or folder the program reads or writes, with os-level file access.
PATH_KEYS = path_keys()
