"""No request holds the others: a 2-token chat request's latency on the OpenAI-compatible server
(inference/openai_server.py) alone, beside a request of `n` at the cap (serve_max_n) and beside a body
at the limit, with fair admission (slots.Slots.admit) and, in the same run, first come first served.

    python benchmarks/request_fairness.py [--model qwen3-tiny] [--slots 8] [--n 16] [--wide-tokens 64]
        [--repeats 5] [--out F]

Each case starts the wide request (or the large body) and, 0.2 s later, the 2-token request, and
measures the 2-token request from its send to its reply, `--repeats` times (the median is reported;
the first, compiling, round is left out). The "first come first served" rows replace the admission
policy's pick (slots._fair) by arrival order for those runs only. The large body is a `/tokenize`
of one message holding just under 8 MiB of text, which the server renders and tokenizes off its
event loop. Prints a table and writes benchmarks/results/request_fairness.json (or --out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import threading
import time


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="qwen3-tiny")
  parser.add_argument("--slots", type=int, default=8, help="rows the batcher decodes together")
  parser.add_argument("--n", type=int, default=16, help="the wide request's choices (serve_max_n's default)")
  parser.add_argument("--wide-tokens", type=int, default=64, help="each wide choice's max_tokens")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "request_fairness.json"))
  args = parser.parse_args()

  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl runs
  import httpx
  import jax

  from maxtext.configs import pyconfig
  from maxtext.inference import slots
  from maxtext.inference.continuous_batching import ContinuousBatcher
  from maxtext.inference.openai_server import MAX_BODY_BYTES, OpenAIServer
  from maxtext.inference.step_keys import StepKeys
  from maxtext.input_pipeline.chat_parser import ConfigChatParser
  from maxtext.input_pipeline.tokenizer import tokenizer_for
  from maxtext.models import load
  from maxtext.utils.mesh import create_meshes

  cfg = pyconfig.initialize(["bench", "rl.yml", f"model_name={args.model}"])
  model = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  tokenizer = tokenizer_for(cfg.model)
  batcher = ContinuousBatcher(model, cfg.sampling.kv_cache_size, args.slots, steps_per_dispatch=4)
  server = OpenAIServer(batcher, tokenizer, ConfigChatParser(tokenizer, ""), args.model, StepKeys(0), max_n=args.n)
  url = server.start("127.0.0.1", 0)
  fair = slots._fair

  def arrival_order(waiting, count, holding):
    return [waiting.popleft() for _ in range(min(count, len(waiting)))]

  def chat(max_tokens: int, n: int = 1) -> httpx.Response:
    body = {
      "model": args.model,
      "messages": [{"role": "user", "content": "What is 2 + 3?"}],
      "max_tokens": max_tokens,
      "n": n,
      "temperature": 1.0,
    }
    return httpx.post(f"{url}/chat/completions", json=body, timeout=600)

  big_text = "x " * ((MAX_BODY_BYTES - 4096) // 2)

  def large_body() -> httpx.Response:
    body = {"model": args.model, "messages": [{"role": "user", "content": big_text}]}
    return httpx.post(url.removesuffix("/v1") + "/tokenize", json=body, timeout=600)

  def short_latency(beside) -> float:
    done: list = []
    other = threading.Thread(target=lambda: done.append(beside())) if beside else None
    if other:
      other.start()
      time.sleep(0.2)
    started = time.perf_counter()
    reply = chat(2)
    latency = time.perf_counter() - started
    assert reply.status_code == 200, reply.text
    if other:
      other.join()
      assert done[0].status_code == 200, done[0].text[:200]
    return latency

  cases = {
    "alone": None,
    f"beside n={args.n} x {args.wide_tokens} tokens": lambda: chat(args.wide_tokens, args.n),
    "beside an 8 MiB /tokenize body": large_body,
  }
  rows = []
  for policy, pick in (("fair", fair), ("first come first served", arrival_order)):
    slots._fair = pick
    for name, beside in cases.items():
      if policy != "fair" and beside is None:
        continue
      short_latency(beside)  # compiles what this case needs
      latencies = [short_latency(beside) for _ in range(args.repeats)]
      rows.append({"policy": policy, "case": name, "median_s": statistics.median(latencies), "latencies_s": latencies})
  slots._fair = fair
  server.stop()
  batcher.close()

  alone = rows[0]["median_s"]
  print("| admission | 2-token request | median latency (s) | x alone |\n| --- | --- | --- | --- |")
  for r in rows:
    r["ratio_to_alone"] = r["median_s"] / alone
    print(f"| {r['policy']} | {r['case']} | {r['median_s']:.3f} | {r['ratio_to_alone']:.1f} |")
  out = {
    "benchmark": "request_fairness",
    "date": datetime.date.today().isoformat(),
    "device": f"{jax.devices()[0].platform}, {os.cpu_count()} cores",
    "python": platform.python_version(),
    "jax": jax.__version__,
    "args": vars(args),
    "rows": rows,
  }
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
