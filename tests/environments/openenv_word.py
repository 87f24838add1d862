"""An OpenEnv environment written with OpenEnv's own API (an `Environment` subclass, its Action and
Observation models, served by `create_app` and uvicorn as OpenEnv's template serves one), for the tests
of rl.agent=openenv. It runs in OpenEnv's own venv (.venv/envs/openenv), not the trainer's:

    .venv/envs/openenv/bin/python tests/environments/openenv_word.py --port 8000

Each episode asks for a word: reset(word=..., seed=...) takes the example's `word` field (else one
drawn from the seed) and the observation asks for it; each step's action is a message, rewarded 1.0
where it holds the word and ended there, else told to try again (reward 0.0) until `turns` tries. With
--hang-steps every step sleeps for an hour (a hung environment); with --fail-on WORD a reset with that
word raises."""

import argparse
import random
import time
from typing import Any

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

WORDS = ("apple", "river", "stone", "cloud")


class WordAction(Action):
  message: str = Field(..., description="The reply")


class WordObservation(Observation):
  prompt: str = Field(default="", description="What the environment says")
  tries: int = Field(default=0, description="Tries so far")


class WordEnvironment(Environment):
  SUPPORTS_CONCURRENT_SESSIONS = True
  TURNS = 2
  HANG = False
  FAIL_ON = ""

  def __init__(self):
    self._state = State(step_count=0)
    self._word = ""

  def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> WordObservation:
    word = kwargs.get("word") or random.Random(seed).choice(WORDS)
    if word == self.FAIL_ON:
      raise RuntimeError(f"cannot play {word}")
    self._word = word
    self._state = State(episode_id=episode_id, step_count=0)
    return WordObservation(prompt=f" Say the word {word}.", done=False, reward=None)

  def step(self, action: WordAction) -> WordObservation:  # type: ignore[override]
    if self.HANG:
      time.sleep(3600)
    self._state.step_count += 1
    hit = self._word in action.message.lower()
    done = hit or self._state.step_count >= self.TURNS
    prompt = "Right." if hit else f"No. Try again: say {self._word}."
    return WordObservation(prompt=prompt, tries=self._state.step_count, done=done, reward=1.0 if hit else 0.0)

  @property
  def state(self) -> State:
    return self._state


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--turns", type=int, default=2)
  parser.add_argument("--hang-steps", action="store_true")
  parser.add_argument("--fail-on", default="")
  args = parser.parse_args()
  WordEnvironment.TURNS, WordEnvironment.HANG, WordEnvironment.FAIL_ON = args.turns, args.hang_steps, args.fail_on
  app = create_app(WordEnvironment, WordAction, WordObservation, env_name="word", max_concurrent_envs=64)
  uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
  main()
