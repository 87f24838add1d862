"""LoRA (lora_rank > 0) through train_rl: Tunix trains only the adapters, the KL reference is the
frozen base without a second copy of the weights, checkpoints hold the adapters, a rerun resumes
them, decode reads them with lora_input_adapters_path, and the HF export (in the run, or by
to_huggingface from the checkpoint) merges them: transformers' greedy decode of the export equals
ours of the adapted model. With trainer and sampler on separate devices, the sampler's log-probs
after training equal the trainer's (the adapters reach the sampler every step)."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from maxtext.checkpoint_conversion import orbax_checkpoint, to_huggingface
from maxtext.inference import decode
from maxtext.integration.tunix import cluster as cluster_lib
from maxtext.integration.tunix import prefix_sharing
from maxtext.models import builder, load
from maxtext.models.shared_prefix import SharedPrefix
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import errors
from maxtext.utils.mesh import create_meshes
from tests.conftest import hf_greedy_tokens, make_config

LORA = [
  "model_name=qwen3-tiny",
  "batch_size=2",
  "rl.num_generations=4",
  "max_response_length=16",
  "num_test_batches=0",
  "adam_weight_decay=0",
  "learning_rate=1e-2",
  "warmup_steps_fraction=0",
  "lora_rank=4",
  "lora_alpha=8",
  "rl.grpo_beta=0.04",
  "checkpoint_period=1",
  "reward_functions=[brevity]",
]
# Shorter completions score higher, so the groups' rewards differ and every step has a gradient.
REWARD = "def brevity(prompts, completions, tmvp_config, **kwargs):\n  return [-len(c) / 50 for c in completions]\n"


def _buffers(model) -> dict:
  return {
    builder.param_name(p): v[...].unsafe_buffer_pointer()
    for p, v in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.LoRAParam)))
  }


def test_lora_trains_only_the_adapters_and_checkpoints_resumes_and_merges_them(tmp_path, capsys, monkeypatch, caplog):
  caplog.set_level(logging.INFO)
  (tmp_path / "reward.py").write_text(REWARD)
  args = [
    *LORA,
    f"reward_functions_path={tmp_path / 'reward.py'}",
    f"base_output_directory={tmp_path}",
    "run_name=lora",
  ]
  clusters = []
  build = cluster_lib.build_cluster
  monkeypatch.setattr(cluster_lib, "build_cluster", lambda *a, **k: clusters.append(build(*a, **k)) or clusters[-1])
  assert train_rl.main(["train_rl", "rl.yml", *args, "num_batches=2", "export_hf=true"]) == 0
  run = tmp_path / "lora"
  # The expected memory at start (adapters' optimizer state, no reference copy) and the peak at the end.
  assert "AdamW moments (adapters)" in caplog.text and "Peak memory (RSS)" in caplog.text
  cluster = clusters[0]
  actor = cluster.actor_trainer.model

  # Only the adapters changed: the base weights are bit for bit the initial ones.
  cfg = make_config(*args, "num_batches=2")
  initial = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  base_before, base_after = builder.to_arrays(builder.base_of(initial)), builder.to_arrays(builder.base_of(actor))
  assert all(np.array_equal(base_before[n], base_after[n]) for n in base_before)
  adapters_before, adapters_after = builder.adapters(initial), builder.adapters(actor)
  assert len(adapters_after) == 2 * 7 * 2  # A and B of 7 projections in each of qwen3-tiny's 2 layers
  assert all(not np.array_equal(adapters_before[n], adapters_after[n]) for n in adapters_after if n.endswith("_b"))
  # The KL reference is the base itself: the actor's base arrays, not a copy, and without adapters.
  reference = cluster.inference_worker.get_model("reference")
  assert isinstance(reference, SharedPrefix)  # it scores each group's prompt once
  reference = reference.model
  assert _buffers(reference) == _buffers(actor)
  assert not builder.adapters(reference)
  # The standard learner keeps no host copy of the weights after a sync (Tunix's policy snapshot), and
  # the trainer gives freed heap back before each micro-batch.
  assert not [a for a in jax.live_arrays() if a.sharding.memory_kind == "pinned_host"]
  assert isinstance(cluster.actor_trainer.training_hooks, cluster_lib.ReleaseFreedMemory)
  # The policy loss scores each group's prompt once (tests/unit/test_shared_prefix.py).
  assert isinstance(cluster.actor_trainer.loss_fn, prefix_sharing.SharedPrefixLoss)

  # Checkpoints hold the adapters (the trained ones), not the base.
  # (stacked, layers.attn.q_proj_lora_a [layers, ...], as the default scan_layers=true holds them)
  saved = orbax_checkpoint.restore_arrays(str(run / "checkpoints"))
  assert ("layers.attn.q_proj_lora_a" in saved) == cfg.model.scan_layers
  saved = builder.per_layer(saved)
  assert set(saved) == set(adapters_after)
  assert all(np.array_equal(saved[n], adapters_after[n]) for n in saved)
  capsys.readouterr()
  assert decode.main(["decode", "rl.yml", "model_name=qwen3-tiny", f"load_parameters_path={run / 'checkpoints'}"]) == 2
  assert "lora_input_adapters_path" in capsys.readouterr().err
  with pytest.raises(errors.InputError, match="lora_alpha=4.0 but the adapters were trained with lora_alpha=8"):
    load.read_adapters(str(run / "checkpoints"), make_config(*args, "lora_alpha=4").model)

  # The export merges the adapters: transformers' greedy decode of it equals ours of base + adapters.
  assert (
    decode.main(
      [
        "decode",
        "rl.yml",
        "model_name=qwen3-tiny",
        "lora_rank=4",
        "lora_alpha=8",
        f"lora_input_adapters_path={run / 'checkpoints'}",
        "prompt=What is 2+3?",
        "max_response_length=12",
        "decode_sampling_temperature=0",
      ]
    )
    == 0
  )
  ours = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  ref = hf_greedy_tokens(run / "hf", "What is 2+3?", 12)
  assert ours["token_ids"] == ref
  base_greedy = decode.main(
    [
      "decode",
      "rl.yml",
      "model_name=qwen3-tiny",
      "prompt=What is 2+3?",
      "max_response_length=12",
      "decode_sampling_temperature=0",
    ]
  )
  assert base_greedy == 0 and json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"] != ref
  # to_huggingface merges the checkpoint's adapters into the same weights.
  assert (
    to_huggingface.main(
      [
        "to_huggingface",
        "rl.yml",
        "model_name=qwen3-tiny",
        "lora_rank=4",
        "lora_alpha=8",
        f"lora_input_adapters_path={run / 'checkpoints'}",
        f"hf_output_path={tmp_path / 'merged'}",
      ]
    )
    == 0
  )
  exported, merged = load_file(run / "hf" / "model.safetensors"), load_file(tmp_path / "merged" / "model.safetensors")
  assert set(exported) == set(merged) and all(np.array_equal(exported[k], merged[k]) for k in exported)

  # A rerun resumes the adapters and trains on (with a learning-rate schedule over 3 batches).
  assert train_rl.main(["train_rl", "rl.yml", *args, "num_batches=3", "resume_with_changes=true"]) == 0
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert orbax_checkpoint.steps(str(run / "checkpoints" / "actor"))[-1] == 3
  resumed = clusters[-1].actor_trainer.model
  assert all(np.array_equal(base_before[n], a) for n, a in builder.to_arrays(builder.base_of(resumed)).items())


_SPLIT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from maxtext.integration.tunix import cluster as cluster_lib, rollout, rollout_setup
    from maxtext.models import load
    from maxtext.trainers.post_train.rl import train_rl
    from maxtext.utils.mesh import create_meshes
    from tests.conftest import hf_greedy_tokens, make_config
    clusters = []
    build = cluster_lib.build_cluster
    cluster_lib.build_cluster = lambda *a, **k: clusters.append(build(*a, **k)) or clusters[-1]
    args = json.loads(sys.argv[1])
    assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
    cluster = clusters[0]
    engine, trainer = cluster.rollout, cluster.actor_trainer.model
    out = engine.generate(["What is 2+3?", "Name a colour."],
                          cluster.cluster_config.rollout_config[rollout_setup.Mode.TRAIN])
    prompts = np.asarray(out.left_padded_prompt_tokens)
    width = max(len(t) for t in out.tokens)
    completions = np.full((len(out.tokens), width), engine.pad_id(), np.int32)
    for row, t in zip(completions, out.tokens):
      row[:len(t)] = t
    cfg = make_config(*args)
    initial = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
    logps = {name: np.asarray(rollout.per_token_logps(model, prompts, completions, engine.pad_id(), engine.eos_id(),
                                                      engine.temperature))
             for name, model in (("sampler", engine.model()), ("trainer", trainer), ("initial", initial))}
    mask = completions != engine.pad_id()
    print(json.dumps({"sampler_vs_trainer": float(np.abs(logps["sampler"] - logps["trainer"])[mask].max()),
                      "initial_vs_trainer": float(np.abs(logps["initial"] - logps["trainer"])[mask].max()),
                      "separate_models": engine.model() is not trainer}))
""")


@pytest.mark.slow  # the fast suite trains, saves, resumes and merges adapters (above)
@pytest.mark.parametrize("scan", ["false", "true"])  # scanned: also in test_scan_layers
def test_lora_adapters_reach_a_sampler_on_other_devices(tmp_path, scan):
  """Trainer and sampler on one host device each: Tunix syncs only the adapters (stacked ones with
  scan_layers); afterwards the sampler's model scores sampled completions as the trainer's does, and
  unlike the initial model."""
  (tmp_path / "reward.py").write_text(REWARD)
  args = [
    *LORA,
    f"scan_layers={scan}",
    f"reward_functions_path={tmp_path / 'reward.py'}",
    f"base_output_directory={tmp_path}",
    "run_name=split",
    "num_batches=2",
    "trainer_devices_fraction=0.5",
    "sampler_devices_fraction=0.5",
  ]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [sys.executable, "-c", _SPLIT, json.dumps(args)],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
    cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  print(result)
  assert result["separate_models"]
  assert result["sampler_vs_trainer"] < 1e-4
  assert result["initial_vs_trainer"] > 100 * max(result["sampler_vs_trainer"], 1e-6)
