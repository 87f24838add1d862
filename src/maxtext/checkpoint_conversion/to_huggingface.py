"""Writes weights (Orbax checkpoint, HF checkpoint directory or GGUF file) as an HF checkpoint.

    python -m maxtext.checkpoint_conversion.to_huggingface rl.yml load_parameters_path=SRC \\
        hf_output_path=DIR [model_name=...] [weight_dtype=bfloat16]

DIR gets config.json, model.safetensors (in weight_dtype) and the tokenizer files with the chat
template, so transformers' AutoModelForCausalLM and AutoTokenizer load it.
"""

from __future__ import annotations

import logging
import sys
import tempfile

from maxtext.configs import cli
from maxtext.configs.run_config import RunConfig
from maxtext.configs.sections import ModelSection

log = logging.getLogger(__name__)


def export(decoder, model: ModelSection, tokenizer, path: str, score=None) -> None:
  """Writes a decoder (any sharding) and its tokenizer as an HF checkpoint directory (local or
  gs://): every process gathers the weights, process 0 writes them. With `score` (a value head
  [emb_dim, 1]) it is a reward model: a one-output *ForSequenceClassification whose `score.weight` is
  that head, without an output layer."""
  import numpy as np

  from maxtext.checkpoint_conversion import hf_checkpoint
  from maxtext.models import builder, hf_layout
  from maxtext.utils import distributed, storage

  state = hf_layout.maxtext_to_hf(builder.to_arrays(decoder), decoder.config)
  if score is not None:
    state = {k: v for k, v in state.items() if not k.startswith("lm_head.")}
    head = np.asarray(distributed.host_array(score)).T
    state["score.weight"] = head.astype(np.float32)  # float32, as the head trains
  classifier = score is not None
  if distributed.is_main() and storage.is_url(path):
    with tempfile.TemporaryDirectory() as local:
      hf_checkpoint.write(local, state, model, tokenizer, classifier)
      storage.upload(local, path)
  elif distributed.is_main():
    hf_checkpoint.write(path, state, model, tokenizer, classifier)
  distributed.barrier("hf_export")
  log.info("Wrote HF checkpoint %s", path)


def convert(cfg: RunConfig) -> None:
  from maxtext.input_pipeline.tokenizer import tokenizer_for
  from maxtext.models.load import load_model
  from maxtext.utils import distributed
  from maxtext.utils import mesh as mesh_lib

  cfg.check(distributed.initialize(), program="to_huggingface")  # the layout fits the devices; the program's key is set
  trainer_mesh, _ = mesh_lib.create_meshes(cfg.mesh, agentic=False)
  export(load_model(cfg.model, trainer_mesh), cfg.model, tokenizer_for(cfg.model), cfg.run.hf_output_path)


def main(argv: list[str]) -> int:
  return cli.main(argv, convert)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
