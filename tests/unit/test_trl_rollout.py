"""A TRL rollout_func (GRPOTrainer(rollout_func=...)'s form) as rl.agent=FILE:NAME: the `trainer` it gets
generates on the episode's session as TRL's VLLMClient does (its ids and log-probs are the session's
record), tokenizes through the served tokenizer, and its other returned fields reach the run's reward
functions; what is not TRL's form is a failed episode naming it; a tiny agentic run trains on it."""

import json

import pytest

from maxtext.inference.openai_server import OpenAIServer
from maxtext.inference.step_keys import StepKeys
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import trl_rollout
from tests.conftest import TINY_AGENTIC
from tests.unit.test_openai_server import _ScriptedBatcher

SAMPLING = {"num_generations": 2, "max_completion_length": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]


@pytest.fixture
def served(qwen3_tokenizer):
  server = OpenAIServer(
    _ScriptedBatcher(qwen3_tokenizer, "Hi there."),
    qwen3_tokenizer,
    ConfigChatParser(qwen3_tokenizer, ""),
    "m",
    StepKeys(0),
  )
  base = server.start("127.0.0.1", 0).removesuffix("/v1")
  yield server, base
  server.stop()


def test_the_trainer_generates_on_the_session_as_trls_vllm_client(served, qwen3_tokenizer):
  server, base = served
  session = server.open_session()
  trainer = trl_rollout.trainer(f"{base}/sessions/{session}/v1", "m", None, 30.0, SAMPLING)
  tok = trainer.processing_class
  ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"]  # as transformers 5's
  assert ids == qwen3_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"]
  assert tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False) == ids
  assert tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == qwen3_tokenizer.decode(ids)
  out = trainer.vllm_generation.vllm_client.generate(prompts=[ids], n=1, max_tokens=trainer.args.max_completion_length)
  (call,) = server.session(session).calls  # recorded in the session: what trains
  assert out["prompt_ids"] == [ids] == [list(call.prompt_ids)]
  assert out["completion_ids"] == [list(call.token_ids)] and len(out["logprobs"][0]) == len(call.token_ids)
  assert tok.decode(out["completion_ids"][0], skip_special_tokens=True) == "Hi there."
  assert tok.batch_decode(out["completion_ids"])[0].startswith("Hi there.<|")  # the end token kept
  chat = trainer.vllm_client.chat([MESSAGES], max_tokens=8)
  assert chat["prompt_ids"] == [ids] and chat["completion_ids"][0] == list(server.session(session).calls[1].token_ids)
  assert tok("Hi there.").input_ids == qwen3_tokenizer("Hi there.").input_ids
  assert trainer.num_generations == 2 and trainer.args.vllm_mode == "server"
  with pytest.raises(ValueError, match="structured outputs are not served"):
    trainer.vllm_client.generate(prompts=[ids], structured_outputs_regex="[0-9]")


def test_the_returned_fields_are_the_reward_functions_and_a_wrong_form_is_refused_naming_it():
  one = {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[-0.5]]}
  fields = trl_rollout.fields_of({**one, "env_reward": [0.25], "env_mask": [[1]], "task": "t"}, "roll")
  assert fields == {"env_reward": 0.25, "task": "t"}  # a list's entry for the one prompt, else the value
  with pytest.raises(TypeError, match=r"roll must return keys \['logprobs'\] in its output dict"):
    trl_rollout.fields_of({"prompt_ids": [[1]], "completion_ids": [[2]]}, "roll")
  with pytest.raises(TypeError, match="roll returned completion_ids for 2 completions; expected one"):
    trl_rollout.fields_of({**one, "completion_ids": [[2], [3]]}, "roll")
  with pytest.raises(TypeError, match="roll returned list; expected a dict"):
    trl_rollout.fields_of([one], "roll")
  with pytest.raises(TypeError, match="which is no JSON value"):
    trl_rollout.fields_of({**one, "state": [object()]}, "roll")
  assert trl_rollout.is_rollout_func(lambda prompts, trainer: {})
  assert not trl_rollout.is_rollout_func(lambda client, model, example: None)


ROLLOUT = '''
def rollout_func(prompts, trainer):
  """TRL's form: generate each prompt's completion with the trainer's vLLM client, and return the
  environment's reward (the reply's length in characters) as an extra field for the reward function."""
  tok = trainer.processing_class
  out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_reward": []}
  for prompt in prompts:
    ids = tok.apply_chat_template(prompt, add_generation_prompt=True)["input_ids"]
    done = trainer.vllm_generation.vllm_client.generate(
      prompts=[ids], n=1, max_tokens=trainer.args.max_completion_length
    )
    text = tok.decode(done["completion_ids"][0], skip_special_tokens=True)
    out["prompt_ids"].append(done["prompt_ids"][0])
    out["completion_ids"].append(done["completion_ids"][0])
    out["logprobs"].append([lp[0] for lp in done["logprobs"][0]])
    out["env_reward"].append(float(len(text)))
  return out
'''

REWARD = """
def reward_from_env(completions, env_reward, **kwargs):
  return [float(r) for r in env_reward]
"""


def test_agentic_grpo_trains_a_rollout_func_its_fields_reaching_the_reward_functions(tmp_path):
  (tmp_path / "rollout.py").write_text(ROLLOUT)
  (tmp_path / "reward.py").write_text(REWARD)
  args = [
    *TINY_AGENTIC,
    f"rl.agent={tmp_path / 'rollout.py'}:rollout_func",
    f"reward_functions_path={tmp_path / 'reward.py'}",
    "reward_functions=[reward_from_env]",
    f"base_output_directory={tmp_path}",
    "run_name=trl",
  ]
  assert train_rl.main(args) == 0
  episodes = [json.loads(line) for line in (tmp_path / "trl" / "episodes.jsonl").read_text().splitlines()]
  assert len(episodes) == 4 and all(e["status"] == "trained" for e in episodes)
  for e in episodes:  # the rollout's env_reward, through the reward function: the reply's length
    assert e["reward"] == float(len(e["messages"][-1]["content"]))
    assert e["calls"]["calls"] == 1
