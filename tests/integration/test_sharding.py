"""Sharding on 8 host devices: layouts agree with one device, parameters are really split, and
trainer/sampler 4/4 runs GRPO. Each case runs in a subprocess because the device count is fixed
when JAX starts."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from maxtext.utils import launch_local

_ENV = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")

_LAYOUT_CHECK = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from jax.sharding import Mesh
    from maxtext.configs import pyconfig
    from maxtext.models import builder
    from maxtext.models.decoder import ModelConfig
    from maxtext.utils.mesh import create_meshes, MESH_AXES

    def logits(cfg, mesh):
      model = builder.init_random(ModelConfig.from_config(cfg.model), mesh, seed=3)
      tokens = jax.random.randint(jax.random.PRNGKey(0), (8, 16), 0, cfg.model.vocab_size)
      pos = jnp.broadcast_to(jnp.arange(16), (8, 16))
      mask = jnp.tril(jnp.ones((16, 16), bool))[None].repeat(8, 0)
      with jax.set_mesh(mesh):
        out, _ = nnx.jit(lambda m, t, p, a: m(t, p, None, a))(model, tokens, pos, mask)
      return model, np.asarray(out)

    base = ["x", "rl.yml", "model_name=qwen3-tiny"]
    one = pyconfig.initialize(base + ["ici_fsdp_parallelism=1"])
    _, ref = logits(one, Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), MESH_AXES))
    report = {}
    for layout in sys.argv[1:]:  # data x fsdp x tensor, "scanned" after it: scan_layers=true
      scanned = layout.endswith("scanned")
      data, fsdp, tensor = map(int, layout.removesuffix(" scanned").split("x"))
      cfg = pyconfig.initialize(base + [f"ici_data_parallelism={data}", f"ici_fsdp_parallelism={fsdp}",
                                        f"ici_tensor_parallelism={tensor}", f"scan_layers={str(scanned).lower()}"])
      mesh, _ = create_meshes(cfg.mesh, agentic=False)
      model, out = logits(cfg, mesh)
      q = (model.layers.attn if scanned else model.layers[0].attn).q_proj[...]
      report[layout] = {
          "max_diff": float(np.abs(out - ref).max()),
          "mesh": dict(mesh.shape),
          "q_spec": [list(a) if isinstance(a, tuple) else a for a in q.sharding.spec],
          "q_shard": list(q.addressable_shards[0].data.shape),
          "q_devices": len(q.sharding.device_set),
          "embed_shard": list(model.embed[...].addressable_shards[0].data.shape),
      }
    print(json.dumps(report))
""")


def test_layouts_match_one_device_and_shard_parameters():
  proc = subprocess.run(
    [sys.executable, "-c", _LAYOUT_CHECK, "1x4x2", "2x2x2", "1x8x1", "8x1x1", "1x4x2 scanned"],
    env=_ENV,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  for layout, r in report.items():
    assert r["max_diff"] <= 1e-5, (layout, r["max_diff"])
  print(report)
  # qwen3-tiny: q_proj [emb 64, heads 4, head_dim 32] by rules embed->fsdp, q_heads->tensor.
  assert report["1x4x2"]["mesh"] == {"data": 1, "fsdp": 4, "tensor": 2}
  assert report["1x4x2"]["q_spec"][:2] == ["fsdp", "tensor"]
  assert report["1x4x2"]["q_shard"] == [16, 2, 32] and report["1x4x2"]["q_devices"] == 8
  assert report["1x4x2"]["embed_shard"] == [151936 // 2, 64 // 4]
  assert report["1x8x1"]["q_shard"] == [8, 4, 32]
  assert report["8x1x1"]["q_shard"] == [64, 4, 32]  # pure data parallelism replicates parameters
  # Stacked layers: the leading 'layers' axis is on no mesh axis (qwen3-tiny's 2 layers in every shard).
  assert report["1x4x2 scanned"]["q_spec"][:3] == [None, "fsdp", "tensor"]
  assert report["1x4x2 scanned"]["q_shard"] == [2, 16, 2, 32]


@pytest.mark.parametrize(
  "scan, algorithm",
  [
    pytest.param("false", "grpo", marks=pytest.mark.slow),  # make test: PPO's run splits the meshes alike
    ("false", "ppo"),
    pytest.param("true", "grpo", marks=pytest.mark.slow),
  ],
)  # scanned: also in test_scan_layers
def test_grpo_and_ppo_on_trainer_and_sampler_4_of_8_devices_each(tmp_path, scan, algorithm):
  """PPO's critic is laid out on the trainer's devices (the first 4), as the actor is."""
  args = [
    "model_name=qwen3-tiny",
    f"scan_layers={scan}",
    f"rl.algorithm={algorithm}",
    "num_batches=2",
    "batch_size=2",
    "rl.num_generations=2",
    "max_response_length=8",
    "num_test_batches=1",
    "eval_batch_size=2",
    "trainer_devices_fraction=0.5",
    "sampler_devices_fraction=0.5",
    "ici_fsdp_parallelism=2",
    "ici_tensor_parallelism=2",
    f"base_output_directory={tmp_path}",
    "run_name=split",
  ]
  proc = subprocess.run(
    [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl", "rl.yml", *args],
    env=_ENV,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "trainer mesh {'data': 1, 'fsdp': 2, 'tensor': 2}" in proc.stderr
  assert "sampler mesh {'data': 1, 'fsdp': 2, 'tensor': 2}" in proc.stderr
  if algorithm == "ppo":
    assert "PPO's critic laid out on the trainer mesh {'data': 1, 'fsdp': 2, 'tensor': 2}, devices [0, 1, 2, 3]" in (
      proc.stderr
    )
  with open(tmp_path / "split" / "metrics.jsonl", encoding="utf-8") as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2]


_DISTRIBUTED = textwrap.dedent("""
    import json, jax
    from maxtext.utils import distributed
    distributed.initialize()
    print(json.dumps({"process_index": jax.process_index(), "process_count": jax.process_count()}))
""")


_LAUNCHERS = {  # rank, port -> the variables each sets
  "jax": lambda rank, port: dict(
    JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(rank)
  ),
  "xpk_gpu": lambda rank, port: dict(
    JAX_COORDINATOR_ADDRESS="localhost",
    JAX_COORDINATOR_PORT=str(port),
    NNODES="2",
    NODE_RANK=str(rank),
    GPUS_PER_NODE="1",
  ),
}


@pytest.mark.parametrize("launcher", _LAUNCHERS)
def test_multi_host_start_up_through_jax_distributed(launcher):
  """Two processes on this machine find each other through the coordinator variables: JAX's own, or
  those XPK sets on a GPU node pool (its TPU slices JAX detects by itself)."""
  port = launch_local.free_port()
  procs = []
  for rank in range(2):
    env = dict(os.environ, JAX_PLATFORMS="cpu", **_LAUNCHERS[launcher](rank, port))
    procs.append(
      subprocess.Popen(
        [sys.executable, "-c", _DISTRIBUTED], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
      )
    )
  results = []
  for p in procs:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    results.append(json.loads(out.strip().splitlines()[-1]))
  assert sorted(r["process_index"] for r in results) == [0, 1]
  assert all(r["process_count"] == 2 for r in results)


_SHARD_OPTIMIZER = textwrap.dedent("""
    import json
    import jax, numpy as np, optax
    from flax import nnx
    from tunix.sft import peft_trainer
    from maxtext.configs import pyconfig
    from maxtext.integration.tunix import cluster
    from maxtext.models import builder
    from maxtext.models.decoder import ModelConfig
    from maxtext.utils.mesh import create_meshes

    cfg = pyconfig.initialize(["x", "rl.yml", "model_name=qwen3-tiny", "ici_fsdp_parallelism=2",
                               "ici_tensor_parallelism=2", "trainer_devices_fraction=0.5",
                               "sampler_devices_fraction=0.5"])
    mesh, _ = create_meshes(cfg.mesh, agentic=False)
    model = builder.init_random(ModelConfig.from_config(cfg.model), mesh, seed=0)
    with jax.set_mesh(mesh):
      trainer = peft_trainer.PeftTrainer(model, optax.adam(1e-3), peft_trainer.TrainingConfig(eval_every_n_steps=10))
    mu = trainer.optimizer.opt_state[0].mu
    layer = mu["layers"] if cfg.model.scan_layers else mu["layers"][0]  # stacked layers (the default) or layer 0
    moved, kept = layer["attn"]["q_proj"], layer["attn"]["k_proj"]
    # (assigning the value would lay it out by the variable's spec again; the raw setter does not)
    moved.set_raw_value(jax.device_put(moved[...], jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())))
    buffer = lambda v: v[...].addressable_shards[0].data.unsafe_buffer_pointer()
    before = {"moved": buffer(moved), "kept": buffer(kept)}
    with jax.set_mesh(mesh):
      cluster.shard_optimizer(trainer, mesh)
    on_spec = lambda v: v[...].sharding.is_equivalent_to(
        jax.sharding.NamedSharding(mesh, nnx.get_partition_spec(nnx.State({"v": v}))["v"].get_value()), v[...].ndim)
    print(json.dumps({
        "moved_on_spec": on_spec(moved), "kept_on_spec": on_spec(kept),
        "moved_replicated": moved[...].sharding.is_fully_replicated,
        "moved_copied": buffer(moved) != before["moved"], "kept_copied": buffer(kept) != before["kept"],
    }))
""")


def test_optimizer_state_laid_out_by_its_specs_without_copying_what_is_in_place():
  """cluster.shard_optimizer (in place of Tunix's, which copies the whole optimizer state): an array
  off its partition spec moves onto it, an array on it stays the same buffer."""
  proc = subprocess.run(
    [sys.executable, "-c", _SHARD_OPTIMIZER], env=_ENV, capture_output=True, text=True, timeout=600, check=False
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert report["moved_on_spec"] and report["kept_on_spec"] and not report["moved_replicated"]
  assert report["moved_copied"] and not report["kept_copied"]
