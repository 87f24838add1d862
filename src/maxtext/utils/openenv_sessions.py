"""rl.agent=openenv with environment.id on the trainer's side: OpenEnv harness sessions (a
`ResourceSessionFactory`, FILE.py:NAME, with environment.args) played in the interpreter environment.python
names, by utils/bridges/openenv_bridge.py run there as a script (OpenEnv pins packages the trainer's venv holds at
other versions, so it never loads here). The run's data rows are the tasks the factory's sessions are made
for.

`prepare` runs the bridge's `check` mode before the model loads (the factory loads and is made);
`OpenEnvSessions.start` runs its `episodes` mode once the policy is served: a process of the run's, killed
with it, that takes the episodes from the hand-out API as a process of rl.agent=http does. Where
environment.url or environment.command also names an environment server, its URL is the factory's
`base_url` keyword argument (unless environment.args gives one).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys

from maxtext.configs.sections import EnvironmentSection
from maxtext.utils import env_server
from maxtext.utils.bridges import openenv_bridge

log = logging.getLogger(__name__)

KEY = "rl.agent=openenv"
BRIDGE = openenv_bridge.__file__


@dataclasses.dataclass(frozen=True)
class OpenEnvSessions:
  """A loaded session factory: what names it, its arguments (JSON), the interpreter that plays it, the
  replies per episode at most and what the bridge said of it (class, whether a ResourceSessionFactory)."""

  id: str
  args: str
  python: str
  max_turns: int
  described: dict

  def start(self, base: str, concurrency: int, timeout_s: float, api_key: str | None) -> env_server.Child:
    """The bridge's episodes mode, taking episodes from the hand-out API at `base` (the server's URL)."""
    argv = [self.python, BRIDGE, "episodes", self.id, self.args, base, str(concurrency), f"{timeout_s:g}"]
    return env_server.bridge([*argv, str(self.max_turns)], api_key)


def prepare(environment: EnvironmentSection, wait_s: float, base_url: str | None) -> OpenEnvSessions:
  """environment.id loaded and its factory made by the bridge in environment.python (this interpreter
  where empty) within `wait_s` (rl.agent_wait_s), `base_url` (an environment server's) among its arguments
  where given; an InputError naming the key otherwise (the bridge's own one line where it refused)."""
  python = environment.python or sys.executable
  args = json.loads(environment.args)
  if base_url is not None:
    args.setdefault("base_url", base_url)
  args_json = json.dumps(args)
  argv = [python, BRIDGE, "check", environment.id, args_json]
  described = json.loads(env_server.run_bridge(argv, KEY, f"environment.id={environment.id}", wait_s))
  log.info(
    "rl.agent=openenv: %s (%s) makes each episode's harness session; the run's data rows are its tasks",
    environment.id,
    described["class"],
  )
  return OpenEnvSessions(environment.id, args_json, python, environment.max_turns, described)
