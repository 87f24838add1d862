"""An environment bridge (utils/bridges/verifiers_bridge.py, utils/bridges/openenv_bridge.py) taking the episodes of one
served policy whose replies are scripted (Qwen3's tool format), for the tests of rl.agent=verifiers and of
OpenEnv's harness sessions."""

from maxtext.inference.openai_server import OpenAIServer
from maxtext.inference.step_keys import StepKeys
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.integration.tunix.tool_format import QwenToolFormat
from maxtext.rl.episode_handouts import EpisodeFailed, EpisodeHandouts
from tests.unit.test_openai_server import _ScriptedBatcher


class Arena:
  """`env` (prepared: anything with start(base, concurrency, timeout_s, api_key)) playing the episodes of
  one server whose scripted policy answers each episode's calls with `replies`, one after another."""

  def __init__(self, env, tokenizer, timeout_s=60.0):
    self.env = env
    self.batcher = _ScriptedBatcher(tokenizer, "")
    self.server = OpenAIServer(
      self.batcher, tokenizer, ConfigChatParser(tokenizer, ""), "m", StepKeys(0), QwenToolFormat()
    )
    self.handouts = EpisodeHandouts(self.server, "m")
    self.timeout_s = timeout_s
    self.bridge = env.start(self.server.start("127.0.0.1", 0).removesuffix("/v1"), 2, timeout_s, None)
    self.tokenizer = tokenizer

  def play(self, replies, example: dict):
    """One episode of `example`: its reward, or the EpisodeFailed it ended with, and its calls."""
    self.batcher.__init__(self.tokenizer, replies)
    session = self.server.open_session()
    future = self.handouts.hand_out(session, example, self.timeout_s + 30, f"rl.agent_timeout_s={self.timeout_s:g}")
    try:
      outcome = future.result(timeout=self.timeout_s + 60).reward
    except EpisodeFailed as failed:
      outcome = failed
    return outcome, self.server.session(session).calls

  def close(self):
    self.handouts.close()
    self.bridge.close()
    self.server.stop()
