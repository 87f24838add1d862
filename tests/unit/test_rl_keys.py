"""Every key of base.yml's rl: section, set alone in standard and in agentic GRPO, either reaches what
that mode builds or stops the config with an error naming the key and the mode."""

import types

import pytest

from maxtext.configs import pyconfig, sections
from maxtext.integration.tunix import agentic, algorithm, learner, ppo, tools, trajectories, user_agent
from maxtext.utils import errors
from tests.conftest import make_config, parser_for

# A value away from the default for every rl.* key, and where each mode's learner shows it.
CHANGED = {
  "rl.algorithm": "ppo",
  "rl.gamma": 0.9,
  "rl.gae_lambda": 0.8,
  "rl.kl_in_reward_coef": 0.1,
  "rl.kl_in_reward_method": "mse_kl",
  "rl.num_generations": 3,
  "rl.num_iterations": 2,
  "rl.grpo_beta": 0.01,
  "rl.kl_loss_mode": "mse_kl",
  "rl.grpo_epsilon": 0.1,
  "rl.advantage_estimator": "rloo",
  "rl.policy_loss_fn": "cispo",
  "rl.loss_algo": "gspo-token",
  "rl.loss_agg_mode": "token-mean",
  "rl.epsilon_high": 0.28,
  "rl.epsilon_c": 3.0,
  "rl.entropy_coef": 0.01,
  "rl.max_concurrency": 5,
  "rl.off_policy_steps": 1,
  "rl.system_prompt": "Be brief.",
  "rl.sampler_is": "token",
  "rl.sampler_is_threshold": 3.0,
  "rl.filter_zero_variance_groups": True,
  "rl.tools": ["calculator"],
  "rl.tools_path": "TOOLS_FILE",
  "rl.max_turns": 2,
  "rl.tool_timeout_s": 1.5,
  "rl.tool_memory_mb": 128,
  "rl.tool_output_max_chars": 100,
  "rl.tool_sandbox": "none",
  "rl.dynamic_sampling": True,
  "rl.dynamic_sampling_max_rounds": 3,
  "rl.overlong_buffer_length": 4,
  "rl.overlong_penalty": 0.5,
  "rl.mask_truncated_completions": True,
  "rl.agent": "AGENT_FILE",
  "rl.agent_timeout_s": 30.0,
  "rl.agent_wait_s": 30.0,
  "rl.agent_host": "0.0.0.0",
  "rl.agent_port": 8123,
  "rl.agent_api_key": "k",
  "rl.agent_sessionless": True,
  "rl.agent_max_failures": 3,
}
# Where the standard learner's sample shaping (shaping.Shaping) shows a key.
SHAPE_FIELDS = {
  "rl.sampler_is": lambda shape: "token" if shape.sampler_is else "",
  "rl.sampler_is_threshold": lambda shape: shape.sampler_is_threshold,
  "rl.dynamic_sampling": lambda shape: shape.dynamic_sampling_rounds > 1,
  "rl.overlong_buffer_length": lambda shape: shape.overlong_buffer_length,
  "rl.mask_truncated_completions": lambda shape: shape.mask_truncated_completions,
}
ALGO_FIELDS = {
  "rl.gamma": "gamma",
  "rl.gae_lambda": "gae_lambda",
  "rl.kl_in_reward_coef": "kl_in_reward_coef",
  "rl.kl_in_reward_method": "kl_in_reward_method",
  "rl.num_generations": "num_generations",
  "rl.num_iterations": "num_iterations",
  "rl.grpo_beta": "beta",
  "rl.kl_loss_mode": "kl_loss_mode",
  "rl.grpo_epsilon": "epsilon",
  "rl.advantage_estimator": "advantage_estimator",
  "rl.policy_loss_fn": "policy_loss_fn",
  "rl.loss_algo": "loss_algo",
  "rl.loss_agg_mode": "loss_agg_mode",
  "rl.epsilon_high": "epsilon_high",
  "rl.epsilon_c": "epsilon_c",
  "rl.entropy_coef": "entropy_coef",
  "rl.max_concurrency": "max_concurrency",
  "rl.off_policy_steps": "off_policy_steps",
  "rl.system_prompt": "system_prompt",
  "rl.sampler_is": "sampler_is",
  "rl.sampler_is_threshold": "sampler_is_threshold",
  "rl.filter_zero_variance_groups": "degenerate_group_masking",
}


def _learner_kwargs(cfg, monkeypatch, tokenizer) -> dict:
  """The keyword arguments train_rl's learner would be built with (the class replaced by a recorder)."""
  record = lambda **kwargs: kwargs
  if cfg.agentic.use_agentic_rollout:
    monkeypatch.setattr(agentic, "AgenticGRPOLearner", record)
    return agentic.build_learner(
      cfg.train,
      cfg.algorithm,
      cfg.sampling,
      cfg.agentic,
      cfg.tools,
      None,
      [],
      parser_for(cfg, tokenizer),
      tools.tool_map(cfg.tools),
      user_agent=user_agent.load(cfg.agent) if cfg.agent.agent else None,
    )
  if cfg.algorithm.algorithm == "ppo":
    monkeypatch.setattr(ppo, "PPOLearner", record)
    monkeypatch.setattr(ppo, "CriticTrainer", lambda *args, **kwargs: args)
    cluster = types.SimpleNamespace(rollout=types.SimpleNamespace(pad_id=lambda: 0, eos_id=lambda: 1))
    return ppo.build_learner(cfg.train, cfg.algorithm, cfg.critic, cfg.sampling, cluster, [], None, None)
  monkeypatch.setattr(learner, "GRPOLearner", record)
  return learner.build_learner(cfg.train, cfg.algorithm, cfg.sampling, None, [])


def _observed(key: str, kwargs: dict):
  if key == "rl.algorithm":
    return "ppo" if isinstance(kwargs["algo_config"], algorithm.PPOConfig) else "grpo"
  if "shape" in kwargs and key in SHAPE_FIELDS:
    return SHAPE_FIELDS[key](kwargs["shape"])
  if key in ALGO_FIELDS:
    return getattr(kwargs["algo_config"], ALGO_FIELDS[key], "not in this mode's algorithm config")
  if key == "rl.dynamic_sampling" and "dynamic_sampling_rounds" in kwargs:
    return kwargs["dynamic_sampling_rounds"] > 1
  if key == "rl.tools":
    return list(kwargs.get("agent_kwargs", {}).get("tool_map", {}))
  if key == "rl.agent" and kwargs.get("user_agent") is not None:
    return kwargs["user_agent"].spec
  return "no consumer"


def test_the_walk_covers_every_rl_key():
  assert sorted(CHANGED) == sorted(
    k for k, _, _ in pyconfig.reference() if k.startswith("rl.") and k != "rl.use_agentic_rollout"
  )


@pytest.mark.parametrize("agentic_mode", [False, True], ids=["standard", "agentic"])
@pytest.mark.parametrize("key", sorted(CHANGED))
def test_each_rl_key_takes_effect_or_is_refused(key, agentic_mode, tmp_path, monkeypatch, smollm2_tokenizer):
  tools_file = tmp_path / "my_tools.py"
  tools_file.write_text(
    "from maxtext.integration.tunix.tools import CalculatorTool\nTOOLS = {'mine': CalculatorTool}\n"
  )
  agent_file = tmp_path / "my_agent.py"
  agent_file.write_text("async def run(client, model, example):\n  return 1.0\n")
  value = {"TOOLS_FILE": str(tools_file), "AGENT_FILE": f"{agent_file}:run"}.get(str(CHANGED[key]), CHANGED[key])
  arg = f"{key}=[{', '.join(value)}]" if isinstance(value, list) else f"{key}={value}"
  mode = "agentic GRPO" if agentic_mode else "standard GRPO"
  try:
    cfg = make_config(arg, f"rl.use_agentic_rollout={str(agentic_mode).lower()}")
    kwargs = _learner_kwargs(cfg, monkeypatch, smollm2_tokenizer)
  except errors.InputError as e:  # a ConfigError, or one naming a key whose file says it would be ignored
    assert key in str(e) and mode in str(e), str(e)
    return
  assert _observed(key, kwargs) == value, f"{key}={value!r} silently ignored by {mode}"


def test_which_keys_each_mode_refuses():
  """Standard GRPO takes the algorithm keys and refuses the agentic ones; agentic GRPO refuses
  rl.num_iterations (its learner trains each batch once) and the tool limits while no tool they
  limit is in use."""

  def refused(*args):
    try:
      make_config(*args)
      return False
    except pyconfig.ConfigError:
      return True

  # set alone, a key that refines another one's setting is refused: it would change nothing
  refines = {"rl.dynamic_sampling_max_rounds", "rl.overlong_penalty", "rl.sampler_is_threshold"}
  files = {"rl.tools_path", "rl.agent"}  # keys naming a file: tried above, with one
  standard = {k for k in CHANGED if k not in files and refused(_arg(k))}
  assert standard == {k for k in sections.AGENTIC_ONLY_KEYS if k.startswith("rl.")} - files | refines | {
    k for k in sections.PPO_ONLY_KEYS if k.startswith("rl.")
  }
  agentic_refused = {k for k in CHANGED if k not in files and refused(_arg(k), "rl.use_agentic_rollout=true")}
  assert agentic_refused == {
    "rl.agent_timeout_s",  # without rl.agent
    "rl.agent_wait_s",  # without rl.agent=http
    "rl.agent_host",
    "rl.agent_port",
    "rl.agent_api_key",
    "rl.agent_sessionless",
    "rl.agent_max_failures",
    "rl.num_iterations",
    "rl.max_turns",
    "rl.tool_timeout_s",
    "rl.tool_memory_mb",
    "rl.tool_output_max_chars",
    "rl.tool_sandbox",
    *sections.STANDARD_ONLY_KEYS,
    *(k for k in sections.PPO_ONLY_KEYS if k.startswith("rl.")),
    "rl.algorithm",  # PPO trains in standard mode
    *refines,
  }
  assert not refused("rl.dynamic_sampling=true", "rl.dynamic_sampling_max_rounds=3", "rl.overlong_buffer_length=4")
  assert not refused("rl.overlong_buffer_length=4", "rl.overlong_penalty=0.5", "rl.sampler_is=token")
  assert not refused("rl.sampler_is=token", "rl.sampler_is_threshold=3.0", "rl.use_agentic_rollout=true")
  assert not refused(
    "rl.use_agentic_rollout=true",
    "rl.tools=[python]",
    "rl.max_turns=2",
    "rl.tool_timeout_s=1.5",
    "rl.tool_memory_mb=128",
    "rl.tool_output_max_chars=100",
    "rl.tool_sandbox=none",
  )
  assert refused("rl.use_agentic_rollout=true", "eval_interval=2")
  assert refused("rl.use_agentic_rollout=true", "rollout_engine=vanilla", "rl.sampler_is=token")


def _arg(key):
  value = CHANGED[key]
  return f"{key}=[{', '.join(value)}]" if isinstance(value, list) else f"{key}={value}"


def test_tool_limits_take_effect_with_the_python_tool():
  cfg = make_config(
    "rl.use_agentic_rollout=true",
    "rl.tools=[python]",
    "rl.tool_output_max_chars=100",
    "rl.tool_memory_mb=64",
    "rl.tool_timeout_s=1.5",
    "rl.max_turns=2",
  )
  python = tools.tool_map(cfg.tools)["python"](name="python", description="")
  long = python.apply(code="print('x' * 5000)")
  assert long.error is None and 100 <= len(long.output) < 200 and "truncated" in long.output
  assert python.apply(code="b = bytearray(200 << 20)\nprint('allocated')").error is not None  # 200 MB > 64 MB
  slow = python.apply(code="import time\ntime.sleep(5)")
  assert "timed out after 1.5 s" in slow.error
  assert trajectories.agent_kwargs(cfg.tools, tools.tool_map(cfg.tools), ())["env_kwargs"]["max_steps"] == 2


@pytest.mark.parametrize(
  "args, message",
  [
    (
      ["rl.use_agentic_rollout=true", "decode_sampling_temperature=0"],
      "agentic GRPO trains on the sampler's log-probs",
    ),
    (["answer_format=last_number", "penalty_incorrect_format=-1"], "penalty_incorrect_format"),
    (["rl.kl_loss_mode=k3"], "expected one of low_var_kl, mse_kl, kl"),
    (["decode_sampling_top_k=-1"], "decode_sampling_top_k=-1: expected an integer >= 0"),
    (["rl.epsilon_c=1.0"], r"rl.epsilon_c=1.0: expected 0 \(off\) or a number > 1"),
    (["rl.epsilon_c=3", "rl.policy_loss_fn=cispo"], "rl.epsilon_c.*rl.policy_loss_fn=cispo has no clipped ratio"),
    (["rl.entropy_coef=-0.1"], "rl.entropy_coef=-0.1: expected a finite number >= 0"),
    (["rl.algorithm=ppo", "rl.num_generations=1", "critic.lr_schedule=cosine"], "critic.lr_schedule"),
  ],
)
def test_settings_that_cannot_take_effect_are_refused(args, message):
  with pytest.raises(pyconfig.ConfigError, match=message):
    make_config(*args)
