"""What remat_policy does to the loss's memory: XLA's planned temporaries
(`memory_analysis().temp_size_in_bytes`) of the gradient of the sampled tokens' mean log-probability,
scored as both learners score it (each group's prompt once, models/shared_prefix.SharedPrefix, through
a KV cache) and as whole sequences, with remat_policy none and full, scanned layers (the default).

    python benchmarks/remat_scoring.py [--model smollm2-135m] [--prompt 256] [--completion 256]
        [--group 4] [--rows 8] [key=value ...]

Compiles only (nothing runs), random weights. Prints a table and writes
benchmarks/results/remat_scoring.json.
"""

from __future__ import annotations

import argparse
import json
import os


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="smollm2-135m")
  parser.add_argument("--prompt", type=int, default=256)
  parser.add_argument("--completion", type=int, default=256)
  parser.add_argument("--group", type=int, default=4)
  parser.add_argument("--rows", type=int, default=8)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "remat_scoring.json"))
  parser.add_argument("overrides", nargs="*", help="more key=value config arguments")
  args = parser.parse_args()

  import jax
  import jax.numpy as jnp
  from flax import nnx

  from maxtext.configs import pyconfig
  from maxtext.integration.tunix import scoring
  from maxtext.models import builder
  from maxtext.models.decoder import ModelConfig
  from maxtext.models.shared_prefix import SharedPrefix
  from maxtext.utils.mesh import create_meshes

  prompt = jnp.ones((args.rows, args.prompt), jnp.int32)
  completion = jnp.ones((args.rows, args.completion), jnp.int32)
  result: dict = {**{k: v for k, v in vars(args).items() if k != "out"}, "temporaries_gb": {}}
  for remat in ("none", "full"):
    cfg = pyconfig.initialize(["bench", "rl.yml", f"model_name={args.model}", f"remat_policy={remat}", *args.overrides])
    mesh = create_meshes(cfg.mesh, agentic=False)[0]
    graphdef, state = nnx.split(builder.init_random(ModelConfig.from_config(cfg.model), mesh, seed=0))
    for scored in ("each prompt once (SharedPrefix)", "whole sequences"):

      def loss(s, scored=scored, graphdef=graphdef):
        model = nnx.merge(graphdef, s)
        if scored.startswith("each"):
          model = SharedPrefix(model, args.prompt, args.group)
        return -scoring.completion_logps(model, prompt, completion, 0, 1, 1.0)[0].mean()

      with jax.set_mesh(mesh):
        compiled = jax.jit(jax.grad(loss)).lower(state).compile()
      result["temporaries_gb"][f"remat {remat}, {scored}"] = compiled.memory_analysis().temp_size_in_bytes / 1e9
  print(f"{args.model}, {args.rows} rows of {args.prompt} + {args.completion} tokens, groups of {args.group}")
  print("| remat_policy, scoring | XLA temporaries GB |\n| --- | --- |")
  for name, value in result["temporaries_gb"].items():
    print(f"| {name} | {value:.2f} |")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
