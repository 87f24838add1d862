"""Many concurrent agent sessions against the OpenAI-compatible server (inference/openai_server.py)
on one continuous batcher: what rl.agent's episodes put on it.

    python benchmarks/served_sessions.py [--model qwen3-tiny] [--sessions 256] [--turns 2]
        [--max-tokens 16] [--slots 64] [--out F]

Each session is a scripted agent with its own `openai.AsyncOpenAI` client on its session's URL (a
training session: temperature 1, its own keys, no budget): `--turns` chat calls, each sending back
the conversation with the reply as it came plus one user message, all sessions at once from one
asyncio loop in this process (the server runs in its own thread). Reports the wall time, calls and
sampled tokens per second, each call's latency (p50, p99, max, from request to response), the errors
(any exception a call raised) and, from the sessions' records, the calls whose prompt did not extend
the conversation (rl.session_stitching: 0 where every continuation was exact). Prints a table and
writes benchmarks/results/served_sessions.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import time

import numpy as np


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="qwen3-tiny")
  parser.add_argument("--sessions", type=int, default=256)
  parser.add_argument("--turns", type=int, default=2)
  parser.add_argument("--max-tokens", type=int, default=16)
  parser.add_argument("--slots", type=int, default=64, help="rows the batcher decodes together")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "served_sessions.json"))
  args = parser.parse_args()

  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl runs
  import jax
  import openai

  from maxtext.configs import pyconfig
  from maxtext.inference.continuous_batching import ContinuousBatcher
  from maxtext.inference.openai_server import OpenAIServer
  from maxtext.inference.sessions import SessionSampling
  from maxtext.inference.step_keys import StepKeys
  from maxtext.input_pipeline.chat_parser import ConfigChatParser
  from maxtext.input_pipeline.tokenizer import tokenizer_for
  from maxtext.integration.tunix.tool_format import QwenToolFormat
  from maxtext.models import load
  from maxtext.rl.session_stitching import stitch
  from maxtext.utils.mesh import create_meshes

  cfg = pyconfig.initialize(
    ["bench", "rl.yml", f"model_name={args.model}", "max_prompt_length=96", f"max_response_length={args.turns * 64}"]
  )
  model = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  tokenizer = tokenizer_for(cfg.model)
  batcher = ContinuousBatcher(model, cfg.sampling.kv_cache_size, args.slots, steps_per_dispatch=4)
  server = OpenAIServer(batcher, tokenizer, ConfigChatParser(tokenizer, ""), args.model, StepKeys(0), QwenToolFormat())
  url = server.start("127.0.0.1", 0)
  base = url.removesuffix("/v1")

  async def agent(i: int, session: str, latencies: list, errors: list) -> None:
    async with openai.AsyncOpenAI(base_url=f"{base}/sessions/{session}/v1", api_key="x", max_retries=0) as client:
      messages: list = [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]
      for turn in range(args.turns):
        started = time.perf_counter()
        try:
          reply = await client.chat.completions.create(model=args.model, messages=messages, max_tokens=args.max_tokens)
        except Exception as e:  # counted, not raised: the table says how many
          errors.append(f"{type(e).__name__}: {e}")
          return
        latencies.append(time.perf_counter() - started)
        messages += [reply.choices[0].message, {"role": "user", "content": f"And turn {turn + 1}?"}]

  async def run_all(sessions: list[str]) -> tuple[list, list, float]:
    latencies: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    await asyncio.gather(*(agent(i, s, latencies, errors) for i, s in enumerate(sessions)))
    return latencies, errors, time.perf_counter() - started

  def open_sessions(n: int, offset: int) -> list[str]:
    sampling = lambda i: SessionSampling(1.0, 1.0, None, key=lambda t, i=i: jax.random.PRNGKey(1000 * (offset + i) + t))
    return [server.open_session(sampling(i)) for i in range(n)]

  try:
    asyncio.run(run_all(open_sessions(min(args.sessions, args.slots), 10**6)))  # compiles the programs
    sessions = open_sessions(args.sessions, 0)
    latencies, errors, wall = asyncio.run(run_all(sessions))
    records = [server.close_session(s).calls for s in sessions]
  finally:
    server.stop()
    batcher.close()
  sampled = sum(len(c.token_ids) for calls in records for c in calls)
  mismatched = sum(stitch(calls, 1 << 30).mismatched for calls in records if calls)
  lat = np.asarray(latencies)
  result = {
    "model": args.model,
    "sessions": args.sessions,
    "turns": args.turns,
    "max_tokens": args.max_tokens,
    "slots": args.slots,
    "device": jax.devices()[0].device_kind,
    "cpu_count": os.cpu_count(),
    "python": platform.python_version(),
    "date": datetime.date.today().isoformat(),
    "wall_s": wall,
    "calls": len(latencies),
    "errors": len(errors),
    "first_errors": errors[:3],
    "calls_per_s": len(latencies) / wall,
    "sampled_tokens_per_s": sampled / wall,
    "latency_p50_s": float(np.percentile(lat, 50)) if len(lat) else None,
    "latency_p99_s": float(np.percentile(lat, 99)) if len(lat) else None,
    "latency_max_s": float(lat.max()) if len(lat) else None,
    "mismatched_calls": mismatched,
  }
  print(
    "| sessions | turns | calls | errors | wall s | calls/s | sampled tok/s | p50 s | p99 s | mismatched calls |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    f"| {args.sessions} | {args.turns} | {result['calls']} | {result['errors']} | {wall:.1f} | "
    f"{result['calls_per_s']:.1f} | {result['sampled_tokens_per_s']:.0f} | {result['latency_p50_s']:.2f} | "
    f"{result['latency_p99_s']:.2f} | {mismatched} |"
  )
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
