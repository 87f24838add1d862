"""Agentic GRPO wiring: every rl.* key reaches Tunix's config, the config-driven chat parser, and
full-length completions kept in trajectories."""

import asyncio
import json
import logging
import threading
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tunix.generate import tokenizer_adapter
from tunix.rl.agentic.agents import model_agent
from tunix.rl.agentic.environments import task_environment
from tunix.rl.agentic.trajectory import trajectory_collect_engine
from tunix.rl.rollout import base_rollout

from maxtext.configs import pyconfig
from maxtext.inference.step_keys import StepKeys
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.integration.tunix import agentic, algorithm, losses, rollout, rollout_setup, step_metrics, trajectories
from maxtext.rl import prompt_feed
from tests.conftest import make_config, parser_for

# The conversation shape Tunix's agents build: system (from the agent), user (the task), then
# assistant and tool turns; user content arrives as a numpy string.
CONVERSATION = [
  {"role": "system", "content": ""},
  {"role": "user", "content": np.str_("What is 12*7?")},
  {"role": "assistant", "content": '<tool_call>{"name": "calculator"}</tool_call>'},
  {"role": "tool", "content": "84"},
  {"role": "assistant", "content": "<answer>84</answer>"},
]


def test_every_rl_key_reaches_the_agentic_config(smollm2_tokenizer):
  cfg = make_config(
    "rl.use_agentic_rollout=true",
    "rl.num_generations=3",
    "rl.grpo_beta=0.01",
    "rl.grpo_epsilon=0.1",
    "rl.epsilon_high=0.28",
    "rl.loss_algo=gspo-token",
    "rl.loss_agg_mode=token-mean",
    "rl.system_prompt=Be brief.",
    "rl.max_concurrency=64",
    "rl.off_policy_steps=2",
    "rl.sampler_is=token",
    "rl.sampler_is_threshold=3.0",
    "rl.filter_zero_variance_groups=true",
    "max_response_length=96",
  )
  c = algorithm.grpo_config(cfg.algorithm, cfg.sampling, cfg.agentic, parser_for(cfg, smollm2_tokenizer).system_prompt)
  assert (c.num_generations, c.beta, c.epsilon, c.epsilon_high) == (3, 0.01, 0.1, 0.28)
  assert (c.loss_algo, c.loss_agg_mode, c.system_prompt) == ("gspo-token", "token-mean", "Be brief.")
  assert (c.max_concurrency, c.off_policy_steps, c.max_response_length) == (64, 2, 96)
  assert (c.sampler_is, c.sampler_is_threshold, c.degenerate_group_masking) == ("token", 3.0, True)
  agentic_cfg = make_config("rl.use_agentic_rollout=true")
  default = algorithm.grpo_config(
    agentic_cfg.algorithm,
    agentic_cfg.sampling,
    agentic_cfg.agentic,
    parser_for(agentic_cfg, smollm2_tokenizer).system_prompt,
  )
  assert default.epsilon_high == default.epsilon and default.sampler_is is None
  assert default.system_prompt.startswith("You are given a problem.")  # the data template's
  assert default.use_rollout_logps  # the default engine, batched, returns the sampler's log-probs
  vanilla = make_config("rl.use_agentic_rollout=true", "rollout_engine=vanilla")
  assert not algorithm.grpo_config(
    vanilla.algorithm, vanilla.sampling, vanilla.agentic, "S"
  ).use_rollout_logps  # vanilla returns none

  def rollout_configs(cfg):
    return rollout_setup.rollout_configs(cfg.sampling, "greedy", cfg.agentic.use_agentic_rollout, eos_id=2)

  configs = rollout_configs(make_config("rl.use_agentic_rollout=true"))
  assert configs[rollout_setup.Mode.TRAIN].return_logprobs and configs[rollout_setup.Mode.EVAL].return_logprobs
  standard = rollout_configs(make_config())  # for the check and the correction of the batch
  assert standard[rollout_setup.Mode.TRAIN].return_logprobs and not standard[rollout_setup.Mode.EVAL].return_logprobs
  assert not rollout_configs(make_config("rollout_engine=vanilla"))[rollout_setup.Mode.TRAIN].return_logprobs


@pytest.mark.parametrize(
  "overrides, recomputed",
  [
    (["rollout_engine=batched"], False),  # the sampler's are the old ones; the loss reports the mismatch
    (["rollout_engine=batched", "rl.sampler_is=token"], True),  # trained on
    (["rollout_engine=vanilla"], True),  # the old policy's
  ],
)
def test_the_trainer_recomputes_log_probs_only_where_trained_on(overrides, recomputed):
  agent = agentic.AgenticGRPOLearner.__new__(agentic.AgenticGRPOLearner)  # the decision alone
  cfg = make_config(*overrides, "rl.use_agentic_rollout=true")
  agent.algo_config = algorithm.grpo_config(cfg.algorithm, cfg.sampling, cfg.agentic, "S")
  assert agent._trainer_recomputes() == recomputed
  assert losses.mismatch_from_old(agent.algo_config) == (not recomputed)


def test_a_recipes_num_iterations_is_not_used_by_agentic_grpo(tmp_path, caplog):
  """rl.num_iterations from a recipe, agentic GRPO from the command line: the run says the recipe's
  key is not used, and the agentic learner's config indeed trains each batch once."""
  recipe = tmp_path / "mine.yml"
  recipe.write_text("base_config: base.yml\nmodel_name: qwen3-tiny\nrl:\n  num_iterations: 3\n")
  with caplog.at_level("WARNING"):
    cfg = pyconfig.initialize(["x", str(recipe), "rl.use_agentic_rollout=true"])
  assert "rl.num_iterations=3 (from " in caplog.text and "is not used" in caplog.text
  assert cfg.algorithm.num_iterations == 3
  assert algorithm.grpo_config(cfg.algorithm, cfg.sampling, cfg.agentic, "S").num_iterations == 1
  assert algorithm.grpo_config(cfg.algorithm, cfg.sampling).num_iterations == 3  # standard GRPO's


def _pieces(parser, messages):
  """What the trainer trains on: the first prompt, each model turn as sampled (its text and the EOS
  token), and the environment's replies (the template's text after an EOS token, then the parser's
  piece, which ends with the generation prompt)."""
  text = parser.parse(messages[:2], add_generation_prompt=True, is_first_msg=True)
  for m in messages[2:]:
    if m["role"] == "assistant":
      text += m["content"] + "<|im_end|>"
    else:
      text += parser.turn_end_suffix + parser.parse([m], add_generation_prompt=True)
  return text


def test_chat_parser_pieces_concatenate_to_the_template_render(smollm2_tokenizer):
  parser = ConfigChatParser(smollm2_tokenizer, "SYS")
  assert not parser.prefix_preserving_variant and parser.turn_end_suffix == "\n"
  whole = smollm2_tokenizer.apply_chat_template(
    [{"role": m["role"], "content": str(m["content"]) or "SYS"} for m in CONVERSATION], tokenize=False
  )
  assert _pieces(parser, CONVERSATION) + "\n" == whole  # the template's newline after the last turn
  assert "array(" not in whole and "{'role'" not in whole


def test_qwen3_thinking_template_falls_back_to_prefix_preserving_chatml(qwen3_tokenizer, caplog):
  with caplog.at_level(logging.WARNING):
    parser = ConfigChatParser(qwen3_tokenizer, "SYS")
  assert parser.prefix_preserving_variant and "not prefix-preserving" in caplog.text
  text = _pieces(parser, CONVERSATION)
  assert text.startswith("<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nWhat is 12*7?<|im_end|>\n")
  assert "<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n" in text
  assert "<|im_end|>\n<|im_start|>user\n<tool_response>" in text  # the newline after a turn's EOS
  assert text.endswith("<|im_start|>assistant\n<answer>84</answer><|im_end|>")


def _engine(agent, env, model_call, parser, tokenizer, budget, engine_cls=trajectories.TrajectoryEngine):
  """A trajectory engine for one agent-environment pair with `budget` response tokens."""
  return engine_cls(
    agent,
    env,
    model_call=model_call,
    max_response_length=budget,
    tokenizer=tokenizer_adapter.TokenizerAdapter(tokenizer),
    chat_parser=parser,
  )


def _scripted(replies: list[str], tokenizer):
  """(calls, model_call): a model that answers each turn with the next of `replies` (EOS-terminated
  tokens), recording them in calls."""
  calls: list[str] = []

  def model_call(messages, env=None, max_generation_steps=None, prompt_ids=None):
    calls.append(replies[len(calls)])
    tokens = np.asarray(tokenizer.encode(calls[-1], add_special_tokens=False) + [tokenizer.eos_token_id])
    return base_rollout.RolloutOutput(
      text=[calls[-1]], logits=None, tokens=[tokens], left_padded_prompt_tokens=None, logprobs=None
    )

  return calls, model_call


def _collect(engine_cls, smollm2_tokenizer, budget, response_len):
  def model_call(messages, env=None, max_generation_steps=None):
    return base_rollout.RolloutOutput(
      text=["<answer>42</answer>"],
      logits=None,
      tokens=[np.arange(response_len)],
      left_padded_prompt_tokens=None,
      logprobs=None,
    )

  agent = model_agent.ModelAgent(system_prompt="SYS")
  env = task_environment.TaskEnvironment({"prompts": "What is 6*7?", "answer": "42"})
  engine = _engine(
    agent, env, model_call, ConfigChatParser(smollm2_tokenizer, "SYS"), smollm2_tokenizer, budget, engine_cls
  )
  asyncio.run(engine.collect(mode="Trajectory"))
  return [m["content"] for m in agent.chat_completions if m["role"] == "assistant"]


@pytest.mark.parametrize("response_len", [15, 16])  # under the budget, and the whole budget
def test_full_length_completions_are_kept(smollm2_tokenizer, response_len):
  assert _collect(trajectories.TrajectoryEngine, smollm2_tokenizer, 16, response_len) == ["<answer>42</answer>"]
  tunix = _collect(trajectory_collect_engine.TrajectoryCollectEngine, smollm2_tokenizer, 16, response_len)
  assert tunix == ([] if response_len == 16 else ["<answer>42</answer>"])  # Tunix drops the full-length one


def _conversation(*tool_results):
  msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
  for r in tool_results:
    msgs += [
      {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
      {"role": "tool", "content": "Tool returned result: " + r},
    ]
  return msgs + [{"role": "assistant", "content": "<answer>84</answer>"}]


def test_tool_metrics_of_scripted_conversations():
  """3 conversations: 2 call a tool, 1 of those 2 calls fails."""
  conversations = [_conversation("84"), _conversation("Error: ZeroDivisionError: division by zero"), _conversation()]
  m = step_metrics.conversation_metrics(step_metrics.conversation_counts(conversations))
  assert (m["tools/calls"], m["tools/failed_calls"]) == (2, 1)
  assert m["tools/call_frequency"] == pytest.approx(2 / 3)
  assert m["tools/failure_frequency"] == pytest.approx(1 / 2)
  assert m["turns/mean"] == pytest.approx((2 + 2 + 1) / 3)


def test_rewards_see_every_assistant_turn():
  joined = trajectories.joined_assistant_turns(_conversation("84"))
  first = next(m for m in joined if m["role"] == "assistant")
  assert first["content"] == "<tool_call>{}</tool_call>\n<answer>84</answer>"
  single = _conversation()
  assert trajectories.joined_assistant_turns(single) == single


def test_first_prompt_renderer_is_what_the_tool_agent_sends_first(smollm2_tokenizer):
  """max_prompt_length filters on the prompt the sampler really gets: system prompt plus the tools'
  descriptions, the user turn and the generation prompt."""
  from tunix.rl.agentic.agents import tool_agent
  from tunix.rl.agentic.environments import tool_environment

  from maxtext.integration.tunix import tools

  cfg = make_config("rl.use_agentic_rollout=true", "rl.tools=[calculator]", "rl.system_prompt=SYS")
  parser = parser_for(cfg, smollm2_tokenizer)
  tool_map = tools.tool_map(cfg.tools)
  sent = []

  def model_call(messages, env=None, max_generation_steps=None):
    sent.append(parser.parse(messages, add_generation_prompt=True, is_first_msg=True))  # as Tunix's _model_call
    return base_rollout.RolloutOutput(
      text=["<answer>1</answer>"], logits=None, tokens=[np.arange(4)], left_padded_prompt_tokens=None, logprobs=None
    )

  task = {"prompts": np.str_("Solve: What is 6*7?"), "question": "What is 6*7?", "answer": "42"}
  env = tool_environment.ToolEnvironment(task, tool_map=tool_map, max_steps=2)
  # Tunix's ToolAgent takes the raw question as the user turn, not the templated user content.
  agent = tool_agent.ToolAgent(system_prompt=parser.system_prompt, tool_map=tool_map, tool_parser_name="qwen")
  asyncio.run(_engine(agent, env, model_call, parser, smollm2_tokenizer, 16).collect(mode="Trajectory"))
  assert "Solve:" not in sent.pop()
  agent = trajectories.ConversationAgent(system_prompt=parser.system_prompt, tool_map=tool_map)
  env = tool_environment.ToolEnvironment(task, tool_map=tool_map, max_steps=2)
  engine = _engine(agent, env, model_call, parser, smollm2_tokenizer, 16)
  asyncio.run(engine.collect(mode="Trajectory"))
  expected = trajectories.first_prompt_renderer(cfg.tools, parser, tool_map)("Solve: What is 6*7?")
  assert sent == [expected]
  assert expected.startswith("<|im_start|>system\nSYS") and "calculator" in expected
  plain = trajectories.first_prompt_renderer(
    make_config("rl.use_agentic_rollout=true", "rl.system_prompt=SYS").tools, parser
  )("What is 6*7?")
  assert plain == parser.parse(
    [{"role": "system", "content": "SYS"}, {"role": "user", "content": "What is 6*7?"}],
    add_generation_prompt=True,
    is_first_msg=True,
  )


def test_later_turns_continue_the_trained_token_stream(smollm2_tokenizer):
  """Token in, token out: a tool call sampled as an unusual token sequence (one token per character)
  is continued exactly as sampled, and the trained stream is the template's rendering of the
  conversation; re-rendering the text and re-tokenizing it (Tunix's way) gives other tokens."""
  from tunix.rl.agentic.environments import tool_environment

  from maxtext.integration.tunix import tools

  encode = lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)
  call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
  turns = [[t for ch in call for t in encode(ch)], encode("<answer>84</answer>")]
  eos = smollm2_tokenizer.eos_token_id
  parser = ConfigChatParser(smollm2_tokenizer, "SYS")
  seen = []

  def model_call(messages, env=None, max_generation_steps=None, prompt_ids=None):
    text = parser.parse(messages, add_generation_prompt=True, is_first_msg=True)
    seen.append((prompt_ids, text))
    tokens = np.asarray(turns[len(seen) - 1] + [eos])
    padded = np.asarray([[0, 0] + encode(text)])  # as an engine returns it: left-padded
    return base_rollout.RolloutOutput(
      text=[smollm2_tokenizer.decode(tokens[:-1])],
      logits=None,
      tokens=[tokens],
      left_padded_prompt_tokens=padded,
      logprobs=None,
    )

  tool_map = {"calculator": tools.CalculatorTool}
  agent = trajectories.ConversationAgent(system_prompt="SYS", tool_map=tool_map)
  env = tool_environment.ToolEnvironment({"prompts": "What is 12*7?", "answer": "84"}, tool_map=tool_map, max_steps=3)
  engine = _engine(agent, env, model_call, parser, smollm2_tokenizer, 512)
  asyncio.run(engine.collect(mode="Trajectory"))
  assert [ids is None for ids, _ in seen] == [True, False]
  stream, turn2 = engine.token_stream(), seen[1][0]
  assert stream[: len(turn2)].tolist() == turn2.tolist()
  assert stream[len(turn2) :].tolist() == turns[1] + [eos]
  [first, second] = agent.trajectory.steps  # the loss sees the model's tokens only, not the tool's
  assert second.assistant_masks.tolist() == [1] * (len(turns[1]) + 1)
  assert first.assistant_masks.tolist() == [1] * (len(turns[0]) + 1)
  assert len(first.env_masks) > 5 and not first.env_masks.any()
  assert any(m["role"] == "tool" and "84" in str(m["content"]) for m in agent.chat_completions)
  whole = parser.render(agent.chat_completions)
  assert smollm2_tokenizer.decode(stream.tolist()) + "\n" == whole
  assert "SYS\n\nYou are provided with function signatures" in whole
  assert encode(seen[1][1]) != turn2.tolist()


def test_example_turns_open_every_conversation_but_rewards_and_metrics_see_the_models_own(tmp_path, smollm2_tokenizer):
  """The data template's EXAMPLES (a demonstrated tool call) sit between the system turn and the
  user turn in the first prompt the sampler gets, which is the prompt the filter measures and the
  prompt tokens the trainer trains behind; the rewarded completion and the tool metrics count only
  the model's own turns."""
  from tunix.rl.agentic.environments import tool_environment

  from maxtext.integration.tunix import tools

  demo_call = '<tool_call>{"name": "calculator", "arguments": {"expression": "3*4"}}</tool_call>'
  examples = [
    {"role": "user", "content": "What is 3*4?"},
    {"role": "assistant", "content": demo_call},
    {"role": "tool", "content": "Tool returned result: 12"},
    {"role": "assistant", "content": "12"},
  ]
  template = tmp_path / "template.json"
  template.write_text(json.dumps({"SYSTEM_PROMPT": "SYS", "TEMPLATE": "Q: {question}", "EXAMPLES": examples}))
  cfg = make_config("rl.use_agentic_rollout=true", "rl.tools=[calculator]", f"data_template_path={template}")
  parser, tool_map = parser_for(cfg, smollm2_tokenizer), tools.tool_map(cfg.tools)
  replies = ['<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>', "84"]
  sent = []

  def model_call(messages, env=None, max_generation_steps=None, prompt_ids=None):
    sent.append(parser.parse(messages, add_generation_prompt=True, is_first_msg=True))
    encode = lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)
    tokens = np.asarray(encode(replies[len(sent) - 1]) + [smollm2_tokenizer.eos_token_id])
    padded = np.asarray([[0, 0] + encode(sent[-1])])  # as an engine returns what it sampled from
    return base_rollout.RolloutOutput(
      text=[replies[len(sent) - 1]], logits=None, tokens=[tokens], left_padded_prompt_tokens=padded, logprobs=None
    )

  kwargs = trajectories.agent_kwargs(cfg.tools, tool_map, parser.example_turns)
  agent = kwargs["agent_class"](system_prompt=parser.system_prompt, **kwargs["agent_kwargs"])
  env = tool_environment.ToolEnvironment(
    {"prompts": "Q: What is 12*7?", "answer": "84"}, tool_map=tool_map, max_steps=3
  )
  engine = _engine(agent, env, model_call, parser, smollm2_tokenizer, 512)
  asyncio.run(engine.collect(mode="Trajectory"))
  first = trajectories.first_prompt_renderer(cfg.tools, parser, tool_map)("Q: What is 12*7?")
  assert sent[0] == first
  assert (
    first.index("SYS")
    < first.index(demo_call)
    < first.index("Tool returned result: 12")
    < first.index("Q: What is 12*7?")
  )
  # The trainer trains behind the tokens the sampler saw (Tunix's own per-message tokenization
  # would drop the example assistant turns' openings).
  prompt = np.asarray(engine.prompt_tokens)
  assert smollm2_tokenizer.decode(prompt[2:]) == first
  conversation = trajectories.without_examples(agent.chat_completions)
  assert [m["role"] for m in conversation] == ["system", "user", "assistant", "tool", "assistant"]
  assert step_metrics.conversation_counts([agent.chat_completions])["calls"] == 2  # the demonstrated call counted too
  assert step_metrics.conversation_counts([conversation])["calls"] == 1
  completion = next(m["content"] for m in trajectories.joined_assistant_turns(conversation) if m["role"] == "assistant")
  assert completion == "\n".join(replies)


@pytest.mark.parametrize("agent_class", ["tunix", "ours"])
def test_malformed_tool_call_arguments_come_back_as_errors_instead_of_stopping_the_rollout(
  agent_class, smollm2_tokenizer, caplog
):
  """Model-written calls whose arguments are a string, a list, or a `finish` call with a string:
  Tunix's ToolAgent hands them to ToolEnvironment, which raises (json.loads on the string, .get on
  it); ours answers each with the tool's error text and the episode goes on to its end."""
  from tunix.rl.agentic.agents import tool_agent
  from tunix.rl.agentic.environments import tool_environment

  from maxtext.integration.tunix import tools

  replies = [
    '<tool_call>{"name": "calculator", "arguments": "12*7"}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": [12, 7]}</tool_call>',
    '<tool_call>{"name": "finish", "arguments": "84"}</tool_call>',
  ]
  parser = ConfigChatParser(smollm2_tokenizer, "SYS")
  calls, model_call = _scripted(replies, smollm2_tokenizer)

  tool_map = {"calculator": tools.CalculatorTool}
  if agent_class == "tunix":
    agent = tool_agent.ToolAgent(system_prompt="SYS", tool_map=tool_map, tool_parser_name="qwen")
  else:
    agent = trajectories.ConversationAgent(system_prompt="SYS", tool_map=tool_map)
  env = tool_environment.ToolEnvironment(
    {"prompts": "What is 12*7?", "question": "What is 12*7?", "answer": "84"}, tool_map=tool_map, max_steps=4
  )
  engine = _engine(agent, env, model_call, parser, smollm2_tokenizer, 512)
  if agent_class == "tunix":
    with pytest.raises(json.JSONDecodeError):
      asyncio.run(engine.collect(mode="Trajectory"))
    return
  with caplog.at_level(logging.WARNING):
    asyncio.run(engine.collect(mode="Trajectory"))
  assert "Unknown dict observation" not in caplog.text  # the episode's empty last observation is no warning
  assert calls == replies  # all three turns ran; the finish call ended the episode
  outputs = [str(m["content"]) for m in agent.chat_completions if m["role"] == "tool"]
  assert len(outputs) == 2 and all(
    o.startswith("Tool returned result: Error:") and "invalid_arguments" in o for o in outputs
  ), outputs


@pytest.mark.parametrize(
  "reply, calls",
  [
    ('<tool_call>{"name": "c", "arguments": {"x": 1}}</tool_call>', [("c", {"x": 1})]),
    (
      'a <tool_call>{"name": "c", "arguments": {"x": 1}</tool_call> b <tool_call>{"name": "c", "arguments": {}}'
      "</tool_call>",
      [(None, "not JSON"), ("c", {})],
    ),
    ('<tool_call>{"arguments": {}}</tool_call>', [(None, 'a "name" string')]),
    ('<tool_call>["c", {}]</tool_call>', [(None, 'a "name" string')]),
    ('<tool_call>{"name": "c", "arguments": {}}', [(None, "no </tool_call>")]),
    ("84", []),
  ],
)
def test_tool_call_parser_makes_a_call_of_every_malformed_one(reply, calls):
  """Each <tool_call> is a call; a malformed one (name None here) is a MALFORMED_CALL saying why."""
  parsed = trajectories.ToolCallParser().parse(reply)
  assert len(parsed) == len(calls)
  for call, (name, arguments) in zip(parsed, calls):
    if name is None:
      assert call.name == trajectories.MALFORMED_CALL and arguments in call.arguments["problem"]
    else:
      assert (call.name, call.arguments) == (name, arguments)


def test_a_malformed_tool_call_comes_back_as_an_error_turn_and_counts_as_a_failed_call(smollm2_tokenizer, capsys):
  """A call whose JSON does not parse: Tunix's parser printed it and the reply ended the conversation
  as its answer; the agent and environment the learner builds answer it with an error text in the
  tool turn, which tools/failed_calls counts, and the conversation goes on."""
  from maxtext.integration.tunix import tools

  replies = [
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}</tool_call>',  # a brace short
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>',
    "<answer>84</answer>",
  ]
  calls, model_call = _scripted(replies, smollm2_tokenizer)

  cfg = make_config("rl.use_agentic_rollout=true", "rl.tools=[calculator]")
  kwargs = trajectories.agent_kwargs(cfg.tools, {"calculator": tools.CalculatorTool}, ())
  agent = kwargs["agent_class"](system_prompt="SYS", **kwargs["agent_kwargs"])
  env = kwargs["env_class"]({"prompts": "What is 12*7?", "answer": "84"}, **kwargs["env_kwargs"])
  engine = _engine(agent, env, model_call, ConfigChatParser(smollm2_tokenizer, "SYS"), smollm2_tokenizer, 512)
  asyncio.run(engine.collect(mode="Trajectory"))
  assert calls == replies
  outputs = [str(m["content"]) for m in agent.chat_completions if m["role"] == "tool"]
  assert outputs[0].startswith("Tool returned result: Error: malformed tool call: not JSON (Expecting ',' delimiter")
  assert outputs[1:] == ["Tool returned result: 84"]
  counts = step_metrics.conversation_counts([agent.chat_completions])
  assert (counts["calls"], counts["failed"]) == (2, 1)
  assert "Error parsing tool call" not in capsys.readouterr().out


class _RecordingEngine(rollout.WithoutExtras):
  """A rollout engine that records the key each prompt is sampled with (its rollout config's seed)
  and tags a prompt's tokens with the versions the prompt names: prompt (group, sample, turn) was
  sampled by versions [10 * group + sample - turn, 10 * group + sample]. Every call also draws an
  unnamed key, as other callers' calls do, which must not move the named ones."""

  def __init__(self):
    self.keys = StepKeys(3)
    self.seeds: dict[tuple, np.ndarray] = {}
    self.budgets: set[int] = set()
    self._lock = threading.Lock()

  def generate(self, prompts, rollout_config, **kwargs):
    (prompt,) = prompts
    group, sample, turn = (int(x) for x in (prompt.split(",") if isinstance(prompt, str) else prompt))
    self.keys.next()
    with self._lock:
      self.seeds[(group, sample, turn)] = np.asarray(rollout_config.seed)
      self.budgets.add(rollout_config.max_tokens_to_generate)
    base = 10 * group + sample
    return rollout.VersionedOutput(
      text=["x"],
      logits=None,
      tokens=[np.asarray([5, 6], np.int32)],
      left_padded_prompt_tokens=np.zeros((1, 4), np.int32),
      logprobs=[np.asarray([-0.5, -0.5], np.float32)],
      versions=[np.asarray([base - turn, base], np.int32)],
    )


def _bare_learner(engine) -> agentic.AgenticGRPOLearner:
  """An agentic learner with only what _model_turn reads: the cluster's engine and training rollout
  config, the chat parser (renders the first turn as "group,sample,0"), the config and the version."""
  learner = object.__new__(agentic.AgenticGRPOLearner)
  config = base_rollout.RolloutConfig(temperature=0.7, max_tokens_to_generate=8)
  learner.rl_cluster = types.SimpleNamespace(rollout=engine, get_rollout_config=lambda mode: config)
  learner.chat_parser = types.SimpleNamespace(parse=lambda messages, **_: messages[0]["content"])
  learner.algo_config = types.SimpleNamespace(use_rollout_logps=True)
  learner.policy_version = 0
  return learner


def _two_turns(learner, group: int, sample: int) -> types.SimpleNamespace:
  """Two model turns of conversation (group, sample): the first from its chat, the second from its
  token stream, as TrajectoryEngine calls them."""
  env = types.SimpleNamespace(task={}, extra_kwargs={"group_id": group, "pair_index": sample})
  out = learner._model_turn([{"role": "user", "content": f"{group},{sample},0"}], env, max_generation_steps=5)
  assert isinstance(out, rollout.VersionedOutput)  # the engine's own output, versions included
  learner._model_turn(None, env, max_generation_steps=5, prompt_ids=np.asarray([group, sample, 1]))
  return env


def test_agentic_turn_keys_and_versions_travel_in_arguments_and_return_values():
  """Each model turn is sampled with the key its (group, round, sample, turn) names, passed in its
  rollout config, whatever order the conversations' threads arrive in; each conversation's policy
  version is its own oldest token's, read from the engine's output (not from another thread's call)."""
  conversations = [(g, s) for g in (4, 9) for s in range(3)]
  one_by_one = _RecordingEngine()
  learner = _bare_learner(one_by_one)
  envs = {c: _two_turns(learner, *c) for c in conversations}
  concurrent = _RecordingEngine()
  learner = _bare_learner(concurrent)
  with ThreadPoolExecutor(max_workers=len(conversations)) as pool:
    in_threads = dict(
      zip(reversed(conversations), pool.map(lambda c: _two_turns(learner, *c), reversed(conversations)))
    )
  expected = {(g, s, t): np.asarray(StepKeys(3).for_request(g, 0, s, t)) for g, s in conversations for t in range(2)}
  for seeds in (one_by_one.seeds, concurrent.seeds):
    assert seeds.keys() == expected.keys()
    for name, key in expected.items():
      np.testing.assert_array_equal(seeds[name], key)
  assert one_by_one.budgets == concurrent.budgets == {5}
  for g, s in conversations:
    assert envs[(g, s)].task["policy_version"] == in_threads[(g, s)].task["policy_version"] == 10 * g + s - 1


@pytest.mark.parametrize(
  "batches, global_steps, fed",
  [
    ([["a", "b"], ["c", "d"]], 0, 2),
    ([["a", "b"], ["c"]], 0, 1),  # a short batch ends the feed, as the end of the data does
    ([["a", "b"], ["c", "d"]], 5, 0),  # max_steps reached
  ],
)
def test_the_feed_gets_full_batches_until_the_data_or_max_steps_end(batches, global_steps, fed):
  learner = object.__new__(agentic.AgenticGRPOLearner)
  config = types.SimpleNamespace(max_steps=5)
  learner.rl_cluster = types.SimpleNamespace(
    global_steps=global_steps, cluster_config=types.SimpleNamespace(training_config=config)
  )
  learner._feed = prompt_feed.PromptFeed(prompt_feed.ProcessShare(0, 1, 2), None, first_step=0)
  data = iter([{"prompts": np.array(b)} for b in batches])
  handed = [learner._feed_next(data, 2) for _ in range(len(batches) + 1)]
  assert handed == [True] * fed + [False] * (len(batches) + 1 - fed)

  async def drain():
    return [p["prompts"].tolist() async for p in learner._feed.prompts(asyncio.get_running_loop())]

  assert asyncio.run(drain()) == [[x] for b in batches[:fed] for x in b]


WEATHER_TOOLS = '''
def get_weather(city: str, unit: str = "celsius") -> str:
  """Gets the current weather in a city.

  Args:
    city: the name of the city
    unit: celsius or fahrenheit
  """
  return f"22 degrees {unit} in {city}"


TOOLS = [get_weather]
'''


def test_a_trl_style_function_tool_is_described_to_the_model_and_called_in_an_episode(tmp_path, smollm2_tokenizer):
  """A plain typed function in rl.tools_path (TRL's form): the first prompt's system turn shows its
  schema as it shows a BaseTool's (name, description, parameters from the docstring), and in an
  episode the model's call gets the function's result in the tool turn, a call with arguments that
  do not fit its signature an error turn, and the conversation goes on."""
  from transformers.utils import get_json_schema

  from maxtext.integration.tunix import tools

  path = tmp_path / "my_tools.py"
  path.write_text(WEATHER_TOOLS)
  cfg = make_config(
    "rl.use_agentic_rollout=true", "rl.tools=[get_weather]", f"rl.tools_path={path}", "rl.system_prompt=SYS"
  )
  parser, tool_map = parser_for(cfg, smollm2_tokenizer), tools.tool_map(cfg.tools)
  first = trajectories.first_prompt_renderer(cfg.tools, parser, tool_map)("What is the weather in Paris?")
  namespace: dict = {}
  exec(WEATHER_TOOLS, namespace)
  shown = json.dumps([get_json_schema(namespace["get_weather"])], ensure_ascii=False, indent=2)
  assert shown in first  # as Tunix's tool prompt dumps every tool's schema
  for text in ('"name": "get_weather"', "Gets the current weather in a city.", '"city"', "the name of the city"):
    assert text in first
  assert '"unit"' in first and "celsius or fahrenheit" in first and '"required": [\n' in first

  replies = [
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"town": "Paris"}}</tool_call>',
    "It is 22 degrees in Paris.",
  ]
  calls, model_call = _scripted(replies, smollm2_tokenizer)
  kwargs = trajectories.agent_kwargs(cfg.tools, tool_map, parser.example_turns)
  agent = kwargs["agent_class"](system_prompt=parser.system_prompt, **kwargs["agent_kwargs"])
  env = kwargs["env_class"]({"prompts": "What is the weather in Paris?", "answer": "22"}, **kwargs["env_kwargs"])
  engine = _engine(agent, env, model_call, parser, smollm2_tokenizer, 512)
  asyncio.run(engine.collect(mode="Trajectory"))
  assert calls == replies
  outputs = [str(m["content"]) for m in agent.chat_completions if m["role"] == "tool"]
  assert outputs == [
    "Tool returned result: 22 degrees celsius in Paris",
    "Tool returned result: Error: arguments ['town'] do not fit get_weather(city: str, unit: str = 'celsius') -> str: "
    "missing a required argument: 'city'",
  ]
  counts = step_metrics.conversation_counts([agent.chat_completions])
  assert (counts["calls"], counts["failed"]) == (2, 1)
