"""An OpenEnv environment of one step, written with OpenEnv's own API and served by its create_app (in
OpenEnv's own venv), for the learning test of rl.agent=openenv (tests/integration/test_learning.py):
the random_digit task's rule as an environment. reset() says nothing more; the step's action is the
reply, rewarded `sign` (1.0, or -1.0 with --sign -1) where it starts with a digit, else 0.0, and the
episode is done.

    .venv/envs/openenv/bin/python tests/environments/openenv_digit.py --port 8000
"""

import argparse
import re
from typing import Any

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class DigitAction(Action):
  message: str = Field(..., description="The reply")


class DigitObservation(Observation):
  text: str = Field(default="", description="What the environment says")


class DigitEnvironment(Environment):
  SUPPORTS_CONCURRENT_SESSIONS = True
  SIGN = 1.0

  def __init__(self):
    self._state = State(step_count=0)

  def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> DigitObservation:
    self._state = State(episode_id=episode_id, step_count=0)
    return DigitObservation(text="", done=False, reward=None)

  def step(self, action: DigitAction) -> DigitObservation:  # type: ignore[override]
    self._state.step_count += 1
    digit = bool(re.match(r"\s*\d", action.message))
    return DigitObservation(text="", done=True, reward=self.SIGN if digit else 0.0)

  @property
  def state(self) -> State:
    return self._state


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--sign", type=float, default=1.0)
  args = parser.parse_args()
  DigitEnvironment.SIGN = args.sign
  app = create_app(DigitEnvironment, DigitAction, DigitObservation, env_name="digit", max_concurrent_envs=64)
  uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
  main()
