"""Generates completions for `prompt` with the same KV-cache sampler the RL rollouts use.

    python -m maxtext.inference.decode rl.yml load_parameters_path=... prompt="..." \\
        max_response_length=64 decode_sampling_temperature=0

Prints one JSON object per prompt on stdout, {"prompt", "completion", "token_ids"}; logs go to stderr.
"""

from __future__ import annotations

import contextlib
import json
import sys

from maxtext.configs.pyconfig import ConfigError
from maxtext.utils import cli


def decode(cfg) -> list[dict]:
  """Completions (text and token ids, EOS included when generated) of cfg.prompt."""
  from maxtext.checkpoint_conversion.load import load_model  # pylint: disable=import-outside-toplevel
  from maxtext.input_pipeline.tokenizer import tokenizer_for  # pylint: disable=import-outside-toplevel
  from maxtext.integration.tunix import learner  # pylint: disable=import-outside-toplevel
  from maxtext.integration.tunix.rollout import RolloutEngine  # pylint: disable=import-outside-toplevel
  from maxtext.utils import mesh as mesh_lib  # pylint: disable=import-outside-toplevel

  mesh_lib.maybe_initialize_distributed()
  _, mesh = mesh_lib.create_meshes(cfg)
  tokenizer = tokenizer_for(cfg)
  texts = [
      tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
      if cfg.use_chat_template else p
      for p in cfg.prompt
  ]
  for p, text in zip(cfg.prompt, texts):
    n = len(tokenizer(text, add_special_tokens=False).input_ids)
    if n > cfg.max_prompt_length:
      raise ConfigError(f"prompt {p[:40]!r}...: {n} tokens exceed max_prompt_length={cfg.max_prompt_length}")
  rollout_config = learner.rollout_configs(cfg, tokenizer.eos_token_id)[learner.Mode.TRAIN]
  engine = RolloutEngine(load_model(cfg, mesh), tokenizer, mesh, rollout_config, seed=cfg.decode_seed)
  out = engine.generate(texts, rollout_config)
  return [
      {"prompt": p, "completion": completion, "token_ids": [int(t) for t in tokens]}
      for p, completion, tokens in zip(cfg.prompt, out.text, out.tokens)
  ]


def _job(cfg) -> None:
  stdout = sys.stdout
  with contextlib.redirect_stdout(sys.stderr):  # anything the libraries print stays off stdout
    results = decode(cfg)
  for record in results:
    print(json.dumps(record, ensure_ascii=False), file=stdout)


def main(argv: list[str]) -> int:
  return cli.main(argv, _job)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
