"""A TRL `rollout_func` run as an episode of rl.agent=FILE:NAME (in an agent worker, as utils/agent_runner.py
runs an agent function): TRL's GRPOTrainer(rollout_func=NAME) form, `NAME(prompts, trainer) -> dict`.

TRL calls it with a batch's prompts, each already repeated num_generations times, and takes one completion
per prompt; here each episode calls it with one prompt, the example's conversation (`messages`: the
system prompt, the data template's example turns and the user turn, TRL's conversational form), and takes
one completion. `trainer` is what a rollout_func reaches of TRL's trainer, on the episode's session of the
served policy:
- `trainer.vllm_generation.vllm_client` (and `trainer.vllm_client`): TRL's VLLMClient's `generate(prompts,
  n=1, ..., max_tokens=16, logprobs=0)` (text or token-id prompts, through /v1/completions) and
  `chat(messages, n=1, ..., max_tokens=16, tools=None)` (through /v1/chat/completions), each returning
  {prompt_ids, completion_ids, logprobs, logprob_token_ids} as TRL's does. The session samples as the run's
  rollouts do (temperature, top-p, top-k), whatever the call asks; a structured-output regex, which would
  change what is sampled, raises;
- `trainer.processing_class`: the served model's tokenizer through the session's /tokenize and /detokenize
  routes: `apply_chat_template(messages, tools=None, add_generation_prompt=False, tokenize=True,
  return_dict=True)` as transformers 5's, `encode`, `decode`, `batch_decode` and calling it on a text
  (`.input_ids`). Text is encoded as data: a control token's spelling in it is text, so send token ids
  (apply_chat_template's) to write turns;
- `trainer.args` (max_completion_length, num_generations, temperature, top_p, top_k, use_vllm, vllm_mode)
  and `trainer.num_generations`.

The returned dict must hold prompt_ids, completion_ids and logprobs (TRL's check), one entry per prompt;
what trains is the session's record of what was sampled (the calls the function made), not the ids it
returns. Its other fields (`env_mask` aside, which the session's record makes unneeded) go to the run's
reward functions as keyword arguments, as TRL forwards them: a list's entry for the prompt, else the
value; they must be JSON values. The episode's reward is then the reward functions'.
"""

from __future__ import annotations

import inspect
import json
import types
from collections.abc import Callable
from typing import Any

FORM = "or a TRL rollout_func `def NAME(prompts, trainer)` returning {prompt_ids, completion_ids, logprobs, ...}"
REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


def is_rollout_func(fn: Any) -> bool:
  """A plain (not async) function that takes (prompts, trainer): TRL's rollout_func form."""
  if not inspect.isfunction(fn) or inspect.iscoroutinefunction(fn):
    return False
  try:
    inspect.signature(fn).bind(None, None)
  except TypeError:
    return False
  return True


class _Session:
  """The episode's session: its OpenAI base URL (/sessions/ID/v1), the model id and the server's key."""

  def __init__(self, base_url: str, model: str, api_key: str | None, timeout_s: float):
    import httpx

    self.base_url, self.root, self.model = base_url, base_url.removesuffix("/v1"), model
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    self.http = httpx.Client(headers=headers, timeout=timeout_s)

  def post(self, url: str, body: dict) -> dict:
    done = self.http.post(url, json={"model": self.model, **body})
    if done.status_code != 200:
      raise RuntimeError(f"POST {url}: {done.status_code} {done.text}")
    return done.json()


class VLLMClient:
  """TRL's VLLMClient's generate and chat on the episode's session (see the module docstring)."""

  def __init__(self, session: _Session):
    self._session = session

  def generate(
    self, prompts, features=None, n: int = 1, *, max_tokens: int = 16, structured_outputs_regex=None, **_sampling
  ) -> dict[str, list]:
    if features is not None or structured_outputs_regex is not None:
      raise ValueError("vllm_client.generate: image features and structured outputs are not served here")
    out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "logprob_token_ids": []}
    for prompt in prompts:
      body = {"prompt": prompt, "n": n, "max_tokens": max_tokens, "logprobs": 0, "return_token_ids": True}
      choices = self._session.post(f"{self._session.base_url}/completions", body)["choices"]
      out["prompt_ids"].append(choices[0]["prompt_token_ids"])
      for c in choices:
        out["completion_ids"].append(c["token_ids"])
        out["logprobs"].append([[lp] for lp in c["logprobs"]["token_logprobs"]])
        out["logprob_token_ids"].append([[t] for t in c["token_ids"]])
    return out

  def chat(
    self, messages, n: int = 1, *, max_tokens: int = 16, tools=None, structured_outputs_regex=None, **_sampling
  ) -> dict[str, list]:
    if structured_outputs_regex is not None:
      raise ValueError("vllm_client.chat: structured outputs are not served here")
    out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "logprob_token_ids": []}
    for conversation in messages:
      body: dict[str, Any] = {
        "messages": conversation,
        "n": n,
        "max_tokens": max_tokens,
        "logprobs": True,
        "return_token_ids": True,
      }
      if tools:
        body["tools"] = tools
      done = self._session.post(f"{self._session.base_url}/chat/completions", body)
      out["prompt_ids"].append(done["prompt_token_ids"])
      for c in done["choices"]:
        out["completion_ids"].append(c["token_ids"])
        out["logprobs"].append([[t["logprob"]] for t in c["logprobs"]["content"]])
        out["logprob_token_ids"].append([[t] for t in c["token_ids"]])
    return out


class _Encoding(dict):
  """What calling a tokenizer returns: `input_ids` by key and by attribute."""

  def __getattr__(self, name: str):
    try:
      return self[name]
    except KeyError:
      raise AttributeError(name) from None


class Tokenizer:
  """The served model's tokenizer through the session's /tokenize and /detokenize (module docstring)."""

  def __init__(self, session: _Session):
    self._session = session

  def _tokenize(self, body: dict) -> list[int]:
    return self._session.post(f"{self._session.root}/tokenize", body)["tokens"]

  def apply_chat_template(
    self, conversation, tools=None, add_generation_prompt: bool = False, tokenize: bool = True, return_dict=True, **_
  ):
    """As transformers 5's: the ids as {input_ids, attention_mask} (return_dict=False: the ids; tokenize=False:
    the text)."""
    body = {"messages": conversation, "add_generation_prompt": add_generation_prompt}
    if tools:
      body["tools"] = tools
    ids = self._tokenize(body)
    if not tokenize:
      return self.decode(ids)
    return _Encoding(input_ids=ids, attention_mask=[1] * len(ids)) if return_dict else ids

  def encode(self, text: str, add_special_tokens: bool = True, **_) -> list[int]:
    return self._tokenize({"prompt": text, "add_special_tokens": add_special_tokens})

  def __call__(self, text, add_special_tokens: bool = True, **_) -> _Encoding:
    if isinstance(text, str):
      return _Encoding(input_ids=self.encode(text, add_special_tokens))
    return _Encoding(input_ids=[self.encode(t, add_special_tokens) for t in text])

  def decode(self, ids, skip_special_tokens: bool = False, **_) -> str:
    body = {"tokens": list(ids), "skip_special_tokens": skip_special_tokens}
    return self._session.post(f"{self._session.root}/detokenize", body)["prompt"]

  def batch_decode(self, sequences, skip_special_tokens: bool = False, **_) -> list[str]:
    return [self.decode(s, skip_special_tokens) for s in sequences]


def trainer(base_url: str, model: str, api_key: str | None, timeout_s: float, sampling: dict) -> Any:
  """The `trainer` a rollout_func gets (module docstring); `sampling`: the run's num_generations,
  max_completion_length, temperature, top_p and top_k."""
  session = _Session(base_url, model, api_key, timeout_s)
  client = VLLMClient(session)
  args = types.SimpleNamespace(use_vllm=True, vllm_mode="server", **sampling)
  return types.SimpleNamespace(
    vllm_generation=types.SimpleNamespace(vllm_client=client),
    vllm_client=client,
    processing_class=Tokenizer(session),
    args=args,
    num_generations=sampling["num_generations"],
  )


def fields_of(output: Any, name: str) -> dict[str, Any]:
  """The reward functions' fields of `name`'s output for its one prompt (module docstring); TypeError
  where the output is not the dict TRL takes."""
  if not isinstance(output, dict):
    raise TypeError(f"{name} returned {type(output).__name__}; expected a dict with {list(REQUIRED)}")
  missing = [k for k in REQUIRED if k not in output]
  if missing:
    raise TypeError(f"{name} must return keys {missing} in its output dict (as TRL's GRPOTrainer requires)")
  for k in REQUIRED:
    if not isinstance(output[k], list) or len(output[k]) != 1:
      raise TypeError(f"{name} returned {k} for {_count(output[k])} completions; expected one, for its one prompt")
  fields = {}
  for k, v in output.items():
    if k in REQUIRED or k in ("env_mask", "logprob_token_ids"):
      continue
    value = v[0] if isinstance(v, list) and len(v) == 1 else v
    try:
      json.dumps(value)
    except (TypeError, ValueError):
      raise TypeError(
        f"{name} returned {k}={value!r}, which is no JSON value (fields go to the reward functions)"
      ) from None
    fields[k] = value
  return fields


def _count(value: Any) -> str:
  return str(len(value)) if isinstance(value, list) else f"a {type(value).__name__}, not a list of"


def episode(fn: Callable, name: str, sampling: dict) -> Callable:
  """The episode `fn` (a rollout_func) plays: (base_url, model, api_key, timeout_s, example) -> the fields
  its reward functions get."""

  def play(base_url: str, model: str, api_key: str | None, timeout_s: float, example: dict) -> dict[str, Any]:
    return fields_of(fn([example["messages"]], trainer(base_url, model, api_key, timeout_s, sampling)), name)

  return play
