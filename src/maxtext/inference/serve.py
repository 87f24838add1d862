"""Serves the policy at an OpenAI-compatible (vLLM-shaped) HTTP endpoint on the continuous batcher.

    python -m maxtext.inference.serve rl.yml model_name=qwen3-0.6b load_parameters_path=... \\
        serve_port=8000

The model, weights and tokenizer load as maxtext.inference.decode loads them; the context is
max_prompt_length + max_response_length tokens, rollout_max_batch_size requests decode together,
unseeded requests draw from decode_seed. It listens on serve_host:serve_port until SIGINT or
SIGTERM and logs its base URL. With serve_api_key (or $MAXTEXT_API_KEY) every route but GET /health
requires it as a Bearer key; without one, a serve_host beyond this machine is warned about.
Endpoints, sessions and errors: inference/openai_server.py and docs/serving.md.
"""

from __future__ import annotations

import logging
import sys

from maxtext.configs import checks, cli
from maxtext.configs.run_config import RunConfig

log = logging.getLogger(__name__)


def serve(cfg: RunConfig) -> None:
  """Runs the server in this thread until it is stopped by a signal."""
  from maxtext.inference.openai_server import OpenAIServer
  from maxtext.input_pipeline.chat_parser import ConfigChatParser
  from maxtext.integration.tunix import rollout_setup, tool_format
  from maxtext.utils import distributed

  cfg.check(distributed.initialize())  # the layout fits the job's devices
  engine, tokenizer = rollout_setup.load_batched_engine(cfg.model, cfg.mesh, cfg.sampling)
  key = checks.api_key(cfg.serve.serve_api_key, checks.SERVE_KEY_ENV)
  server = OpenAIServer(
    engine.batcher,
    tokenizer,
    ConfigChatParser(tokenizer, cfg.agentic.system_prompt),
    cfg.model.model_name,
    engine.keys,
    tool_format.for_tokenizer(tokenizer),
    api_key=key,
    max_n=cfg.serve.serve_max_n,
    max_queued=cfg.serve.serve_max_queued,
  )
  if key is None and cfg.serve.serve_host not in checks.LOOPBACK:
    log.warning(
      "serve_host=%s without serve_api_key (nor $%s): anyone who reaches %s:%d samples from the model",
      cfg.serve.serve_host,
      checks.SERVE_KEY_ENV,
      cfg.serve.serve_host,
      cfg.serve.serve_port,
    )
  try:
    server.run(cfg.serve.serve_host, cfg.serve.serve_port, cfg.run.log_level)
  finally:
    engine.batcher.close()


def main(argv: list[str]) -> int:
  return cli.main(argv, serve)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
