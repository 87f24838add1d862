"""Parity with TRL's GRPOTrainer, the independent reference: the same HF weights, prompt and
completion tokens, advantages, old and reference log-probs and settings go to TRL's own loss
(GRPOTrainer._compute_loss, run by torch) and to ours (the policy loss our learners dispatch, run by
JAX on our decoder); per-token log-probs, the loss and the gradient of every weight must agree, for
each variant TRL also has."""

import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from flax import nnx
from tunix.rl import common, function_registry
from tunix.rl.grpo import grpo_learner

from maxtext.integration.tunix import algorithm
from maxtext.models import builder, hf_layout
from maxtext.rl import shaping
from tests.unit.test_hf_parity import load_ours, write_hf_model

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

PAD, EOS, B, P, L = 0, 1, 4, 5, 7
TEMPERATURE = 0.9
IS_THRESHOLD = 1.1

# variant: (our overrides, TRL GRPOConfig arguments)
VARIANTS = {
  "grpo": (
    ["rl.loss_agg_mode=sequence-mean-token-mean", "rl.epsilon_high=0.28"],
    dict(loss_type="grpo", epsilon_high=0.28),
  ),
  "dapo_aggregation": (
    ["rl.loss_agg_mode=token-mean", "rl.epsilon_high=0.28"],
    dict(loss_type="dapo", epsilon_high=0.28),
  ),
  "dr_grpo": (["rl.loss_agg_mode=sequence-mean-token-scale"], dict(loss_type="dr_grpo", epsilon_high=0.2)),
  # CISPO's cap: ours 1 + rl.epsilon_high (MiniMax-M1's clip(r, ., 1 + eps_high)), TRL's epsilon_high itself.
  "cispo": (
    ["rl.policy_loss_fn=cispo", "rl.loss_agg_mode=token-mean", "rl.epsilon_high=0.1"],
    dict(loss_type="cispo", epsilon_high=1.1),
  ),
  "sequence_ratio": (
    ["rl.loss_algo=gspo-token", "rl.loss_agg_mode=sequence-mean-token-mean"],
    dict(loss_type="grpo", importance_sampling_level="sequence", epsilon_high=0.2),
  ),
  # Truncated importance sampling between sampler and trainer: TRL's vLLM correction (token_truncate),
  # the same weights given to both (shaping.sampler_is_weights of the old log-probs and the sampler's).
  "truncated_is": (
    ["rl.sampler_is=token", f"rl.sampler_is_threshold={IS_THRESHOLD}"],
    dict(loss_type="grpo", epsilon_high=0.2),
  ),
}


def _batch(seed: int = 0) -> dict[str, np.ndarray]:
  """Prompts and completions over tokens 2..255 (0 pads, 1 ends), completions of different lengths."""
  rng = np.random.default_rng(seed)
  prompts = rng.integers(2, 256, (B, P))
  completions = rng.integers(2, 256, (B, L))
  mask = np.ones((B, L), np.int64)
  for row, length in enumerate([L, 5, 3, 6]):
    completions[row, length:] = PAD
    mask[row, length:] = 0
  return {
    "prompts": prompts,
    "completions": completions,
    "mask": mask,
    "advantages": np.array([1.2, -0.7, 0.4, -0.9], np.float32),
    "old_shift": rng.uniform(-0.35, 0.35, (B, L)).astype(np.float32),  # ratios inside and outside the clip range
    "ref_shift": rng.uniform(-0.5, 0.5, (B, L)).astype(np.float32),
    "sampler_shift": rng.uniform(-0.2, 0.2, (B, L)).astype(np.float32),  # weights above the threshold too
  }


def _sampler_is_weights(batch, trainer_logps: np.ndarray, variant: str) -> np.ndarray | None:
  if variant != "truncated_is":
    return None
  old = trainer_logps - batch["old_shift"]
  return shaping.sampler_is_weights(old, old - batch["sampler_shift"], IS_THRESHOLD)


def _trl_side(path, batch, trl_args: dict, beta: float, variant: str):
  """TRL's per-token log-probs, loss and gradients (HF names) through GRPOTrainer._compute_loss."""
  model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
  tokenizer = transformers.PreTrainedTokenizerFast(  # TRL needs one; the loss reads token ids only
    tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel({"<pad>": 0}, "<pad>")),
    pad_token="<pad>",
    eos_token="<pad>",
  )
  args = trl.GRPOConfig(
    output_dir=str(path / "trl"),
    report_to="none",
    use_cpu=True,
    bf16=False,  # float32 throughout, as ours
    per_device_train_batch_size=B,
    num_generations=B,
    max_completion_length=L,
    temperature=TEMPERATURE,
    beta=beta,
    use_bias_correction_kl=False,  # TRL's default weights the KL by the ratio; ours is GRPO's plain k3 term
    epsilon=0.2,
    **trl_args,
  )
  trainer = trl.GRPOTrainer(
    model=model,
    reward_funcs=lambda completions, **kw: [0.0] * len(completions),
    args=args,
    train_dataset=datasets.Dataset.from_list([{"prompt": "x"}] * B),
    processing_class=tokenizer,
  )
  trainer.model.eval()  # no dropout (there is none) and no gradient-accumulation normaliser
  prompt_ids, completion_ids = torch.tensor(batch["prompts"]), torch.tensor(batch["completions"])
  mask = torch.tensor(batch["mask"])
  with torch.no_grad():
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
      trainer.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([torch.ones_like(prompt_ids), mask], 1), L
    )
  inputs = {
    "prompt_ids": prompt_ids,
    "prompt_mask": torch.ones_like(prompt_ids),
    "completion_ids": completion_ids,
    "completion_mask": mask,
    "advantages": torch.tensor(batch["advantages"]),
    "old_per_token_logps": logps - torch.tensor(batch["old_shift"]),
    "ref_per_token_logps": logps - torch.tensor(batch["ref_shift"]),
    "num_items_in_batch": mask.sum(),
  }
  weights = _sampler_is_weights(batch, logps.numpy(), variant)
  if weights is not None:  # what TRL's rollout step sets for vLLM samples (vLLM itself is not installed)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
    inputs["importance_sampling_ratio"] = torch.tensor(weights)
  trainer.model.zero_grad()
  loss = trainer._compute_loss(trainer.model, inputs)
  loss.backward()
  grads = {name: p.grad.detach().numpy().copy() for name, p in trainer.model.named_parameters() if p.grad is not None}
  return logps.numpy(), float(loss.detach()), grads


def _our_side(path, batch, overrides: list[str], beta: float, trl_logps: np.ndarray, variant: str):
  cfg, model = load_ours(path, f"rl.grpo_beta={beta}", "rl.grpo_epsilon=0.2", "rl.kl_loss_mode=low_var_kl", *overrides)
  config = algorithm.grpo_config(cfg.algorithm, cfg.sampling)
  config.temperature = TEMPERATURE  # what the learner sets from the training rollout config
  example = grpo_learner.TrainExample(
    prompt_ids=jnp.asarray(batch["prompts"], jnp.int32),
    prompt_mask=jnp.ones((B, P), bool),
    completion_ids=jnp.asarray(batch["completions"], jnp.int32),
    completion_mask=jnp.asarray(batch["mask"], bool),
    advantages=jnp.asarray(batch["advantages"]),
    ref_per_token_logps=jnp.asarray(trl_logps - batch["ref_shift"]),
    old_per_token_logps=jnp.asarray(trl_logps - batch["old_shift"]),
  )
  weights = _sampler_is_weights(batch, trl_logps, variant)
  if weights is not None:
    assert cfg.algorithm.sampler_is == "token"
    example = example.replace(sampler_is_weights=jnp.asarray(weights))
  loss_fn = function_registry.get_policy_loss_fn(cfg.algorithm.policy_loss_fn)
  (loss, aux), grads = nnx.value_and_grad(lambda m: loss_fn(m, example, config, pad_id=PAD, eos_id=EOS), has_aux=True)(
    model
  )
  # per-layer names (layers.0.attn_norm.scale), whether the decoder's layers are stacked or not
  flat = builder.per_layer({builder.param_name(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(grads)})
  graphdef, state = nnx.split(model)
  logps = common.compute_per_token_logps(
    graphdef, state, example.prompt_ids, example.completion_ids, PAD, EOS, temperature=TEMPERATURE
  )
  return np.asarray(logps), float(loss), hf_layout.maxtext_to_hf(flat, model.config)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
# each variant with the layers unrolled and scanned (the default), without and with the KL term
@pytest.mark.parametrize(("beta", "scan"), [(0.0, "false"), (0.04, "true")])
def test_trl_parity_of_log_probs_loss_and_gradient(tmp_path, variant, beta, scan):
  overrides, trl_args = VARIANTS[variant]
  overrides = [*overrides, f"scan_layers={scan}"]
  write_hf_model(tmp_path, "qwen3-gqa-tied-headdim")
  batch = _batch()
  trl_logps, trl_loss, trl_grads = _trl_side(tmp_path, batch, trl_args, beta, variant)
  our_logps, our_loss, our_grads = _our_side(tmp_path, batch, overrides, beta, trl_logps, variant)
  mask = batch["mask"] > 0
  np.testing.assert_allclose(our_logps[mask], trl_logps[mask], atol=2e-5)
  np.testing.assert_allclose(our_loss, trl_loss, rtol=1e-4, atol=1e-6)
  assert sorted(our_grads) == sorted(trl_grads)
  ours = np.concatenate([our_grads[k].ravel() for k in sorted(our_grads)])
  theirs = np.concatenate([trl_grads[k].ravel() for k in sorted(our_grads)])
  cosine = float(ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs)))
  assert cosine > 0.9999, cosine
  assert abs(np.linalg.norm(ours) / np.linalg.norm(theirs) - 1) < 1e-3
  assert np.linalg.norm(theirs) > 0
