"""A verifiers environment trained by rl.agent=verifiers: this file runs as a script in the interpreter
environment.python names (a venv with verifiers installed: its pins clash with the trainer's) and uses
only the standard library, verifiers and what verifiers installs (httpx, openai), imported where used, so
the trainer imports it for the rows' format alone (content_text) without verifiers. utils/verifiers_env.py
starts it, in one of two modes:

    python verifiers_bridge.py dataset ID ARGS OUT   # the environment's dataset, one JSON line per row, to OUT
    python verifiers_bridge.py episodes ID ARGS BASE CONCURRENCY TIMEOUT_S

ID is what `vf.load_environment` takes (an installed environment's id) or a Python file exporting
`load_environment`; ARGS its keyword arguments as a JSON object (v1 environments take theirs as
{"config": {...}}). Both forms are verifiers' `Environment`: the legacy envs (SingleTurnEnv, MultiTurnEnv,
ToolEnv, ...) and v1's `Env(taskset, harness)`, which adapts itself to it.

`dataset` writes, for each row of `env.get_dataset()`, {"prompt": the text of its user turns, "answer":
its answer as text, "verifiers_input": the row itself as JSON} (the run's data: what it batches and groups,
and the row each episode plays), and prints one JSON line describing the environment. An environment that
does not load, is no verifiers Environment, scores its rollouts as a group or has no dataset exits with 2
and one line on stderr saying so.

`episodes` takes the run's episodes from its hand-out API at BASE with utils/bridges/bridge_common.py's loop (up
to CONCURRENCY at once, each bounded by TIMEOUT_S): each is `env.run_rollout(row, client, model, {})` with
verifiers' token client (OpenAIChatCompletionsTokenClient: multi-turn continuations through POST
/v1/chat/completions/tokens) on the episode's session; its rubric's reward is posted to the session's
/reward route, and a rollout that raises, ends with an error in its state, runs out of time or gets no
finite reward posts {"error": ...} instead (a failed episode, which the run counts). The run's API key,
where it has one, is $MAXTEXT_AGENT_API_KEY.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import sys
import traceback

try:  # run as a script, this folder heads sys.path; imported by the trainer, it is a package's module
  from . import bridge_common
except ImportError:
  import bridge_common  # type: ignore[no-redef]


def load(env_id: str, args: str):
  """The environment `env_id` names, loaded by verifiers with `args`; SystemExit(2) with one line where
  it cannot be."""
  kwargs = bridge_common.keyword_args(args, "load_environment's")
  if importlib.util.find_spec("verifiers") is None:
    bridge_common.refuse(f"environment.python={sys.executable}: verifiers is not installed there")
  import verifiers as vf

  module = env_id
  if env_id.endswith(".py"):  # a file: importable by its name from its folder, as vf.load_environment imports
    sys.path.insert(0, os.path.dirname(os.path.abspath(env_id)))
    module = os.path.basename(env_id)[: -len(".py")]
  try:
    env = vf.load_environment(module, **kwargs)
  except Exception as e:  # noqa: BLE001 (the user's code: whatever it raises is its refusal)
    traceback.print_exc()
    call = bridge_common.call_shown("load_environment", kwargs)
    bridge_common.refuse(f"environment.id={env_id}: {call} failed: {bridge_common.failure(e)}")
  if not isinstance(env, vf.Environment):
    bridge_common.refuse(
      f"environment.id={env_id}: load_environment returned {type(env).__name__}; expected a verifiers Environment"
    )
  if env.requires_group_rollouts or env.provides_advantages:
    bridge_common.refuse(
      f"environment.id={env_id}: its rubric scores a group of rollouts together (group reward functions, a "
      "taskset's init_group or advantages of its own); the run scores each episode alone: not supported"
    )
  return env


def _role(message) -> str | None:
  return message.get("role") if isinstance(message, dict) else getattr(message, "role", None)


def content_text(content) -> str:
  """A message's content as text (its text parts joined; utils/verifiers_env.py reads the rows so too)."""
  if isinstance(content, str):
    return content
  if isinstance(content, list):  # content parts
    return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
  return "" if content is None else str(content)


def dataset(env_id: str, args: str, out: str) -> None:
  env = load(env_id, args)
  try:
    rows = env.get_dataset()
  except Exception as e:  # noqa: BLE001
    traceback.print_exc()
    first = (str(e).splitlines() or [""])[0]
    bridge_common.refuse(f"environment.id={env_id}: its dataset does not load: {type(e).__name__}: {first}")
  count = 0
  with open(out, "w", encoding="utf-8") as f:
    for row in rows:
      row = dict(row)
      prompt = row.get("prompt")
      users = (
        [content_text(m.get("content")) for m in prompt if m.get("role") == "user"] if isinstance(prompt, list) else []
      )
      text = "\n".join(users) if users else content_text(prompt)
      answer = row.get("answer")
      line = {"prompt": text, "answer": "" if answer is None else str(answer)}
      line["verifiers_input"] = json.dumps(row, default=str)
      f.write(json.dumps(line) + "\n")
      count += 1
  if not count:
    bridge_common.refuse(f"environment.id={env_id}: its dataset has no rows")
  form = "v1" if type(env).__module__.startswith("verifiers.v1") else "legacy"
  print(json.dumps({"rows": count, "class": type(env).__name__, "form": form, "tools": len(env.tool_defs or [])}))


async def episodes(env_id: str, args: str, base: str, concurrency: int, timeout_s: float) -> None:
  import openai
  from verifiers.clients import OpenAIChatCompletionsTokenClient

  env = load(env_id, args)
  key = bridge_common.api_key()

  async def play(take: dict) -> dict:
    row = json.loads(take["example"]["verifiers_input"])
    client = openai.AsyncOpenAI(base_url=take["base_url"], api_key=key or "session", max_retries=0, timeout=timeout_s)
    async with client:
      out = await env.run_rollout(row, OpenAIChatCompletionsTokenClient(client), take["model"], {})
    reward, error = out.get("reward"), out.get("error")
    replied = any(_role(m) == "assistant" for m in out.get("completion") or [])
    if error:
      return {"error": f"the rollout ended with an error: {error}"}
    if out.get("is_truncated") and not replied:
      return {
        "error": "verifiers ended the rollout as overlong before any reply: the server refused its first "
        "prompt as past the context (raise max_prompt_length to the first prompt's tokens, tools included)"
      }
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
      return {"error": f"the rubric gave {reward!r}; expected a finite float reward"}
    return {"reward": float(reward)}

  await bridge_common.take_episodes(base, concurrency, timeout_s, play)


def main(argv: list[str]) -> None:
  mode, env_id, args, *rest = argv
  if mode == "dataset":
    dataset(env_id, args, rest[0])
  else:
    base, concurrency, timeout_s = rest
    asyncio.run(episodes(env_id, args, base, int(concurrency), float(timeout_s)))


if __name__ == "__main__":
  main(sys.argv[1:])
