"""Generates completions for `prompt` with the same KV-cache sampler the RL rollouts use.

    python -m maxtext.inference.decode rl.yml load_parameters_path=... prompt="..." \\
        max_response_length=64 decode_sampling_temperature=0

Prints one JSON object per prompt on stdout, {"prompt", "completion", "token_ids"}; logs go to stderr.
"""

from __future__ import annotations

import sys

from maxtext.configs import cli
from maxtext.configs.run_config import RunConfig
from maxtext.utils.errors import InputError


def decode(cfg: RunConfig) -> list[dict]:
  """Completions (text and token ids, EOS included when generated) of the prompt key."""
  from maxtext.integration.tunix import rollout_setup
  from maxtext.utils import distributed

  cfg.check(distributed.initialize())  # the layout fits the job's devices
  sampling = cfg.sampling
  generate, tokenizer = rollout_setup.load_sampler(
    cfg.model, cfg.mesh, sampling, cfg.eval.eval_sampling_strategy, rollout_setup.Mode.TRAIN
  )
  texts = [
    tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
    if sampling.use_chat_template
    else p
    for p in sampling.prompt
  ]
  for p, text in zip(sampling.prompt, texts):
    n = len(tokenizer(text, add_special_tokens=False).input_ids)
    if n > sampling.max_prompt_length:
      raise InputError(f"prompt {p[:40]!r}...: {n} tokens exceed max_prompt_length={sampling.max_prompt_length}")
  out = generate(texts)
  return [
    {"prompt": p, "completion": completion, "token_ids": [int(t) for t in tokens]}
    for p, completion, tokens in zip(sampling.prompt, out.text, out.tokens)
  ]


def main(argv: list[str]) -> int:
  return cli.main(argv, decode)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
