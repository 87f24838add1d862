"""Builds the decoder for a run from load_parameters_path (GGUF file, HF checkpoint directory or
Orbax checkpoint), the model's embedded default, or a seeded random init; and PPO's critic from a
reward model's HF checkpoint (critic.load_parameters_path); and a learned reward model
(reward_model.load_parameters_path)."""

from __future__ import annotations

import dataclasses
import logging
import math
import os

import jax
import numpy as np
import yaml
from etils import epath
from jax.sharding import Mesh

from maxtext import assets
from maxtext.checkpoint_conversion import gguf_reader, hf_checkpoint, hf_config, orbax_checkpoint
from maxtext.configs.sections import ModelSection
from maxtext.models import builder, hf_layout
from maxtext.models.critic import Critic
from maxtext.models.decoder import Decoder, ModelConfig
from maxtext.utils import errors, heap, storage

log = logging.getLogger(__name__)


def _check_gguf_architecture(path: str, model: ModelSection) -> None:
  """The file's architecture is one we read, and its hyperparameters are the config's (those the
  file states and the config has: gemma3's sliding window, say, only where the config defines one)."""
  reader = gguf_reader.open_gguf(path)
  arch = gguf_reader.architecture(reader)
  diffs = []
  for key, theirs in gguf_reader.hyperparameters(reader).items():
    ours = getattr(model, key, None)
    if ours is None:
      continue
    same = math.isclose(ours, theirs, rel_tol=1e-5) if isinstance(theirs, float) else ours == theirs
    if not same:
      diffs.append(f"{key}={ours} but the file has {arch}.{gguf_reader.ARCHITECTURE_KEYS[key]}={theirs}")
  if diffs:
    raise errors.InputError(f"{path}: does not match model_name={model.model_name}: " + "; ".join(diffs))


def parameters_path(model: ModelSection) -> str:
  """The weights of the run; empty for a seeded random init."""
  if model.random_weights:
    return ""
  if model.load_parameters_path:
    return model.load_parameters_path
  if model.model_name in assets.DEFAULT_WEIGHTS:
    return assets.DEFAULT_WEIGHTS[model.model_name]()
  if model.model_name in assets.RANDOM_INIT_MODELS:
    return ""
  raise errors.InputError(
    f"load_parameters_path: required for model_name={model.model_name} (no embedded default weights)"
  )


def read_arrays(path: str, model: ModelSection) -> dict[str, np.ndarray]:
  """Our dotted parameter names -> arrays (as stored) from a GGUF file, HF directory or Orbax checkpoint."""
  mcfg = ModelConfig.from_config(model)
  if path.endswith(".gguf"):
    _check_gguf_architecture(path, model)
    return hf_layout.hf_to_maxtext(gguf_reader.read_hf_state_dict(path), mcfg)
  if hf_config.is_hf_checkpoint(path):
    return hf_layout.hf_to_maxtext(hf_checkpoint.read_state_dict(path), mcfg)
  if orbax_checkpoint.is_orbax_checkpoint(path):
    arrays = orbax_checkpoint.restore_arrays(path)
    if arrays and all(builder.is_adapter(name) for name in arrays):
      raise errors.InputError(
        f"load_parameters_path={path}: holds LoRA adapters only; set lora_input_adapters_path={path} "
        "(with the run's lora_rank) and load_parameters_path to the base weights they were trained on"
      )
    return arrays
  if not os.path.exists(path):
    raise errors.MissingInputError(f"load_parameters_path={path}: no such file or directory")
  raise errors.InputError(
    f"load_parameters_path={path}: expected a .gguf file, an HF checkpoint directory (config.json + "
    "*.safetensors) or an Orbax checkpoint (<step>/model_params)"
  )


def _check_adapters_config(path: str, model: ModelSection) -> None:
  """Adapters inside a run folder must be read with the LoRA settings of that run's config.yml."""
  folder = epath.Path(storage.join(path))
  for _ in range(5):
    saved = folder / "config.yml"
    if saved.is_file():
      trained = yaml.safe_load(saved.read_text()) or {}
      diffs = [
        f"{key}={getattr(model, key)!r} but the adapters were trained with {key}={trained[key]!r}"
        for key in ("lora_rank", "lora_alpha", "lora_module_path")
        if key in trained and trained[key] != getattr(model, key)
      ]
      if diffs:
        raise errors.InputError(f"lora_input_adapters_path={path} (run config {saved}): " + "; ".join(diffs))
      return
    if folder == folder.parent or str(folder.parent) == "gs://":  # the root, or a bucket
      return
    folder = folder.parent


def read_adapters(path: str, model: ModelSection) -> dict[str, np.ndarray]:
  """Dotted adapter names -> arrays from an Orbax checkpoint (a LoRA run's checkpoints/ or one step)."""
  if not orbax_checkpoint.is_orbax_checkpoint(path):
    raise errors.MissingInputError(
      f"lora_input_adapters_path={path}: no Orbax checkpoint there (expected a run's "
      "checkpoints/ folder or one <step> folder of it)"
    )
  _check_adapters_config(path, model)
  adapters = {k: v for k, v in orbax_checkpoint.restore_arrays(path).items() if builder.is_adapter(k)}
  if not adapters:
    raise errors.InputError(
      f"lora_input_adapters_path={path}: the checkpoint holds no LoRA adapters "
      "(a full fine-tuning run's checkpoint loads through load_parameters_path)"
    )
  return adapters


def load_model(model: ModelSection, mesh: Mesh) -> Decoder:
  """The run's decoder: its weights, with LoRA adapters (fresh, or lora_input_adapters_path's) when
  lora_rank > 0. Logs where the weights come from and the attention chosen (attention.select)."""
  mcfg = ModelConfig.from_config(model)
  base_cfg = dataclasses.replace(mcfg, lora_rank=0)
  path = parameters_path(model)
  if not path:
    log.info(
      "Initialising %s randomly (seed %d); attention %s", model.model_name, model.init_weights_seed, mcfg.attention
    )
    decoder = builder.init_random(base_cfg, mesh, model.init_weights_seed)
  else:
    log.info("Loading weights from %s; attention %s", path, mcfg.attention)
    decoder = builder.from_arrays(base_cfg, mesh, read_arrays(path, model), path)
  if mcfg.lora_rank:
    decoder = builder.with_lora(decoder, mcfg, model.init_weights_seed)
    if model.lora_input_adapters_path:
      builder.set_adapters(
        decoder, read_adapters(model.lora_input_adapters_path, model), model.lora_input_adapters_path
      )
  heap.release()  # the pages of the host arrays read and converted
  return decoder


def _sequence_classifier(path: str, key: str, model: ModelSection, mesh: Mesh, what: str) -> Critic:
  """The HF *ForSequenceClassification checkpoint at `path` (of the architecture `model` states) as a
  Critic: its decoder as the trunk, without an output layer, and its one-output `score` head; with
  `model`'s lora_rank, adapters of its own on that trunk. A checkpoint of another kind, with a head of
  more than one output, or with a weight that is not finite is an InputError naming `key` (and the
  weight). Logs `what` and the path."""
  if not hf_config.is_hf_checkpoint(path):
    raise errors.InputError(
      f"{key}: expected an HF *ForSequenceClassification checkpoint (config.json + *.safetensors)"
    )
  kinds = hf_config.architectures(path)
  if not any(kind.endswith("ForSequenceClassification") for kind in kinds):
    raise errors.InputError(f"{key}: config.json's architectures are {kinds}; expected a *ForSequenceClassification")
  state = hf_checkpoint.read_state_dict(path)
  for name, value in state.items():
    if not np.isfinite(np.asarray(value, np.float32)).all():
      raise errors.InputError(f"{key}: {name} holds NaN or infinite values; expected finite weights")
  score = state.pop("score.weight", None)
  if score is None or score.shape != (1, model.emb_dim):
    shape = "no score.weight" if score is None else f"score.weight of shape {list(score.shape)}"
    raise errors.InputError(f"{key}: {shape}; expected a head of one output, [1, {model.emb_dim}]")
  mcfg = ModelConfig.from_config(model)
  trunk_cfg = dataclasses.replace(mcfg, lora_rank=0, tie_embeddings=True)  # no output layer
  log.info("%s %s", what, path)
  trunk = builder.from_arrays(trunk_cfg, mesh, hf_layout.hf_to_maxtext(state, trunk_cfg), path)
  if mcfg.lora_rank:
    trunk = builder.with_lora(trunk, dataclasses.replace(mcfg, tie_embeddings=True), model.init_weights_seed + 1)
  critic = Critic(trunk)
  critic.score[...] = jax.device_put(np.asarray(score, np.float32).T, critic.score[...].sharding)
  heap.release()
  return critic


def critic_from_reward_model(path: str, model: ModelSection, mesh: Mesh) -> Critic:
  """PPO's critic from the HF *ForSequenceClassification checkpoint at `path` (critic.load_parameters_path),
  which must have the policy's architecture (`model`); see _sequence_classifier. A checkpoint of another
  shape than the policy's is an InputError naming the key."""
  key = f"critic.load_parameters_path={path}"
  if hf_config.is_hf_checkpoint(path):
    theirs = hf_config.architecture(path)
    diffs = [
      f"{k}={getattr(model, k)!r} but config.json has {v!r}" for k, v in theirs.items() if getattr(model, k) != v
    ]
    if diffs:
      raise errors.InputError(
        f"{key}: a critic of another shape than the policy ({model.model_name}): " + "; ".join(diffs)
      )
  return _sequence_classifier(path, key, model, mesh, "PPO's critic from the reward model")


def reward_model_section(path: str, policy: ModelSection) -> ModelSection:
  """The model section of the reward model at `path` (reward_model.load_parameters_path): the
  architecture its config.json states, the policy's settings of precision, attention and layout, no
  adapters."""
  if not hf_config.is_hf_checkpoint(path):
    raise errors.InputError(
      f"reward_model.load_parameters_path={path}: expected an HF *ForSequenceClassification checkpoint "
      "(config.json + *.safetensors)"
    )
  return dataclasses.replace(policy, **hf_config.architecture(path), load_parameters_path=path, lora_rank=0)


def reward_model(path: str, policy: ModelSection, mesh: Mesh) -> Critic:
  """The reward model at `path` (reward_model.load_parameters_path) on `mesh`, of its own architecture
  (reward_model_section); see _sequence_classifier."""
  model = reward_model_section(path, policy)
  return _sequence_classifier(
    path, f"reward_model.load_parameters_path={path}", model, mesh, "Loading the reward model"
  )
