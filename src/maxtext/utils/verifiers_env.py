"""rl.agent=verifiers on the trainer's side: a verifiers environment (environment.id, with environment.args)
played in the interpreter environment.python names, by utils/bridges/verifiers_bridge.py run there as a script
(verifiers pins packages the trainer's venv holds at other versions, so it never loads here).

`prepare` runs the bridge's `dataset` mode before the model loads: the environment loads, and its dataset
is written to a JSON-lines file (prompt, answer, verifiers_input) that becomes the run's data
(`data_section`). `VerifiersEnv.start` runs its `episodes` mode once the policy is served: a process of the
run's, killed with it, that takes the episodes from the hand-out API as a process of rl.agent=http does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable

from maxtext.configs.sections import DataSection, EnvironmentSection
from maxtext.utils import env_server, errors
from maxtext.utils.bridges import verifiers_bridge

log = logging.getLogger(__name__)

KEY = "rl.agent=verifiers"
BRIDGE = verifiers_bridge.__file__


@dataclasses.dataclass(frozen=True)
class VerifiersEnv:
  """A loaded verifiers environment: what names it, the file its dataset was written to and what the
  bridge said of it (rows, class, form: legacy or v1, tools)."""

  id: str
  args: str
  python: str
  rows_path: str
  described: dict

  def data_section(self, data: DataSection) -> DataSection:
    """The run's data: the environment's dataset, every row of it for training."""
    return dataclasses.replace(
      data, dataset_name=self.rows_path, prompt_column="prompt", answer_column="answer", train_fraction=1.0
    )

  def first_prompt_renderer(self, parser) -> Callable[[str], str]:
    """A row's prompt text -> its own messages (the environment's system prompt and few-shot turns
    among them) as `parser` (the run's chat parser) renders a first prompt, which max_prompt_length
    bounds; its tools' descriptions are not counted here (the session's first call is checked with them)."""
    opening: dict[str, list[dict]] = {}
    with open(self.rows_path, encoding="utf-8") as f:
      for line in f:
        row = json.loads(line)
        messages = json.loads(row["verifiers_input"]).get("prompt")
        if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
          turns = [
            {"role": m.get("role", "user"), "content": verifiers_bridge.content_text(m.get("content"))}
            for m in messages
          ]
          opening.setdefault(row["prompt"], turns)
    return lambda user: parser.parse(
      opening.get(user) or [{"role": "user", "content": user}], add_generation_prompt=True, is_first_msg=True
    )

  def start(self, base: str, concurrency: int, timeout_s: float, api_key: str | None) -> env_server.Child:
    """The bridge's episodes mode, taking episodes from the hand-out API at `base` (the server's URL)."""
    argv = [self.python, BRIDGE, "episodes", self.id, self.args, base, str(concurrency), f"{timeout_s:g}"]
    return env_server.bridge(argv, api_key)

  def close(self) -> None:
    """Removes the dataset's file."""
    try:
      os.unlink(self.rows_path)
    except FileNotFoundError:
      pass


def prepare(environment: EnvironmentSection, wait_s: float) -> VerifiersEnv:
  """environment.id loaded by the bridge in environment.python (this interpreter where empty) within
  `wait_s` (rl.agent_wait_s) and its dataset written; an InputError naming the key otherwise: the bridge's
  own one line where it refused (not loaded, not an Environment, group-scored, no rows)."""
  python = environment.python or sys.executable
  fd, rows_path = tempfile.mkstemp(prefix="maxtext-verifiers-", suffix=".jsonl")
  os.close(fd)
  argv = [python, BRIDGE, "dataset", environment.id, environment.args, rows_path]
  try:
    described = json.loads(env_server.run_bridge(argv, KEY, f"environment.id={environment.id}", wait_s))
  except errors.InputError:
    os.unlink(rows_path)
    raise
  log.info(
    "rl.agent=verifiers: %s (%s, verifiers' %s form, %d tools): %d rows are the run's data",
    environment.id,
    described["class"],
    described["form"],
    described["tools"],
    described["rows"],
  )
  return VerifiersEnv(environment.id, environment.args, python, rows_path, described)
