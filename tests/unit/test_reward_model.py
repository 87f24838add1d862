"""A learned reward model among the rewards (reward_model.*): a *ForSequenceClassification checkpoint
that transformers itself writes, with a tokenizer and chat template of its own, scores each prompt and
completion as transformers scores the conversation rendered through its own chat template (not the
policy's), pooled at the last token; of its own architecture, not the policy's; weighted beside the
rule rewards or alone; bad checkpoints and keys refused in one line naming the key."""

import numpy as np
import pytest
import tokenizers
import torch
import transformers

from maxtext import tasks
from maxtext.input_pipeline.rewards import RewardSet
from maxtext.rl import reward_model
from maxtext.utils.errors import InputError
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config, template_for
from tests.unit.test_hf_parity import SHAPES, write_hf_model

# A chat template unlike SmolLM2's (ChatML): the reward model's texts must be rendered through it.
_RM_TEMPLATE = (
  "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}<|end|>\n{% endfor %}"
  "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)


def _byte_tokenizer() -> transformers.PreTrainedTokenizerFast:
  """A byte-level tokenizer of 256 byte tokens and two special ones (ids 256, 257), with _RM_TEMPLATE."""
  alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
  model = tokenizers.models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[])
  tok = tokenizers.Tokenizer(model)
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.add_special_tokens(["<|end|>", "<|pad|>"])
  return transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>", chat_template=_RM_TEMPLATE
  )


def write_reward_model(path, shape, seed=1, tokenizer=True, **changes):
  """A randomly initialised *ForSequenceClassification of one of test_hf_parity's shapes (vocabulary 260)
  with the byte tokenizer beside it; returns the transformers model."""
  cls, kwargs = SHAPES[shape]
  torch.manual_seed(seed)
  settings = dict(vocab_size=260, max_position_embeddings=512, initializer_range=0.2, num_labels=1, pad_token_id=257)
  config = cls(**{**settings, **kwargs, **changes})
  model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
  model.save_pretrained(path)
  if tokenizer:
    _byte_tokenizer().save_pretrained(path)
  return model


def _config(policy_dir, reward_dir, *overrides):
  return make_config(
    f"load_parameters_path={policy_dir}",
    f"reward_model.load_parameters_path={reward_dir}",
    "reward_model.micro_batch_size=2",
    "matmul_precision=highest",
    "weight_dtype=float32",
    "dtype=float32",
    *overrides,
  )


def _load(cfg, smollm2_tokenizer):
  template = template_for(cfg, smollm2_tokenizer)
  mesh = create_meshes(cfg.mesh, False)[0]
  return reward_model.load_reward_model(cfg.reward_model, cfg.model, template, mesh), template


_QUESTIONS = ["What is 3 * 4?", "What is 12 * 19?", "What is 2 * 2?", "What is 20 * 7?", "What is 5 * 6?"]
_COMPLETIONS = [
  "<reasoning>3 fours</reasoning><answer>12</answer>",
  "<reasoning>12 * 19 = 228, checked twice over</reasoning><answer>228</answer>",
  "4",
  "<answer>140</answer>",
  "<reasoning>five sixes are thirty</reasoning><answer>30</answer> and more words after it",
]


@pytest.mark.parametrize(
  "policy_shape, rm_shape", [("llama-mha-tied", "llama-mha-tied"), ("qwen3-mqa-untied", "llama-mha-tied")]
)
def test_scores_equal_transformers_on_the_conversation_rendered_with_its_own_chat_template(
  tmp_path, smollm2_tokenizer, policy_shape, rm_shape
):
  write_hf_model(tmp_path / "policy", policy_shape)
  theirs = write_reward_model(tmp_path / "reward", rm_shape)
  cfg = _config(tmp_path / "policy", tmp_path / "reward")
  scorer, template = _load(cfg, smollm2_tokenizer)
  prompts = [template.render(q) for q in _QUESTIONS]
  fields = {"question": np.array(_QUESTIONS), "answer": np.array(["12", "228", "4", "140", "30"])}

  texts = scorer.texts(prompts, _COMPLETIONS, fields)
  for q, c, text in zip(_QUESTIONS, _COMPLETIONS, texts):
    conversation = template.messages(q) + [{"role": "assistant", "content": c}]
    assert text == _byte_tokenizer().apply_chat_template(conversation, tokenize=False)
    assert text.startswith("[SYSTEM] ") and f"[USER] {q}" in text and text.endswith(f"[ASSISTANT] {c}<|end|>\n")
    assert "<|im_start|>" not in text  # not the policy's ChatML

  rm_tokenizer = _byte_tokenizer()
  inputs = rm_tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
  with torch.no_grad():
    expected = theirs(**inputs).logits[:, 0].numpy()  # pooled at the last non-pad token
  assert len(set(inputs["attention_mask"].sum(1).tolist())) == len(texts)  # lengths differ: pooling matters

  reward = scorer.reward_function()
  got = reward(prompts, _COMPLETIONS, **fields)
  assert reward.__name__ == "reward_model"
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
  ids = scorer.token_ids(prompts, _COMPLETIONS, fields)
  np.testing.assert_allclose(scorer.scores(ids[::-1]), expected[::-1], rtol=1e-4, atol=1e-4)  # order kept


def test_a_template_that_is_the_whole_prompt_is_scored_as_the_prompt_and_completion(tmp_path, smollm2_tokenizer):
  write_hf_model(tmp_path / "policy", "llama-mha-tied")
  write_reward_model(tmp_path / "reward", "llama-mha-tied")
  whole = tmp_path / "whole.json"
  whole.write_text(
    '{"SYSTEM_PROMPT": "", "TEMPLATE": "<|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n"}'
  )
  cfg = _config(tmp_path / "policy", tmp_path / "reward", f"data_template_path={whole}")
  scorer, template = _load(cfg, smollm2_tokenizer)
  prompt = template.render("What is 2 * 3?")
  fields = {"question": np.array(["What is 2 * 3?"])}
  assert scorer.texts([prompt], ["6"], fields) == [prompt + "6<|end|>"]  # the EOS TRL appends to plain text
  # The ids scored are those TRL's RewardTrainer trains such a plain-text pair on.
  from datasets import Dataset
  from trl import RewardConfig, RewardTrainer

  theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "reward")
  args = RewardConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False)
  data = Dataset.from_list([{"prompt": prompt, "chosen": "6", "rejected": "5"}])
  trainer = RewardTrainer(model=theirs, args=args, train_dataset=data, processing_class=_byte_tokenizer())
  (row,) = trainer.train_dataset
  assert scorer.token_ids([prompt, prompt], ["6", "5"], {"question": np.array(["What is 2 * 3?"] * 2)}) == [
    row["chosen_ids"],
    row["rejected_ids"],
  ]


def test_the_reward_model_is_weighted_beside_the_rule_rewards_or_alone():
  def rule(prompts, completions, **kwargs):
    return [1.0 for _ in completions]

  def model(prompts, completions, **kwargs):
    return [0.5, -2.0]

  base = RewardSet([rule], (2.0,), ((),))
  beside = base.with_function(model, 3.0, alone=False)
  totals, metrics = beside.score(["p", "q"], ["a", "b"], {}, group_size=2)
  np.testing.assert_allclose(totals, [2.0 + 1.5, 2.0 - 6.0])
  alone = base.with_function(model, 3.0, alone=True)
  totals, metrics = alone.score(["p", "q"], ["a", "b"], {}, group_size=2)
  np.testing.assert_allclose(totals, [1.5, -6.0])
  assert metrics["rewards/rule"][0] == 1.0  # still computed and logged


def test_bad_reward_models_and_keys_are_refused_naming_the_key(tmp_path, smollm2_tokenizer):
  write_hf_model(tmp_path / "policy", "llama-mha-tied")
  write_hf_model(tmp_path / "causal", "llama-mha-tied")
  write_reward_model(tmp_path / "two", "llama-mha-tied", num_labels=2)
  write_reward_model(tmp_path / "bare", "llama-mha-tied", tokenizer=False)
  nan = write_reward_model(tmp_path / "nan", "llama-mha-tied")
  with torch.no_grad():
    nan.model.layers[0].mlp.up_proj.weight[3, 5] = float("nan")
  nan.save_pretrained(tmp_path / "nan")
  cases = {
    "causal": "config.json's architectures are ['LlamaForCausalLM']; expected a *ForSequenceClassification",
    "two": "score.weight of shape [2, 64]; expected a head of one output, [1, 64]",
    "bare": "its tokenizer: tokenizer_path=",
    "nan": "model.layers.0.mlp.up_proj.weight holds NaN or infinite values; expected finite weights",
  }
  for name, message in cases.items():
    path = tmp_path / name
    with pytest.raises(InputError) as raised:
      _load(_config(tmp_path / "policy", path), smollm2_tokenizer)
    assert str(raised.value).startswith(f"reward_model.load_parameters_path={path}: {message}")
  with pytest.raises(InputError, match="reward_model.weight"):
    make_config("reward_model.weight=2.0")
  with pytest.raises(InputError, match=r"reward_model.weight=inf: expected a finite number"):
    make_config(f"reward_model.load_parameters_path={tmp_path / 'two'}", "reward_model.weight=inf")


def test_bradley_terry_loss_against_its_formula():
  chosen, rejected = np.array([1.0, -0.5, 2.0]), np.array([0.0, 0.5, 2.5])
  loss, accuracy = reward_model.bradley_terry_loss(chosen, rejected)
  expected = np.mean(np.log1p(np.exp(-(chosen - rejected))))
  np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
  assert float(accuracy) == pytest.approx(1 / 3)


def test_the_task_template_gives_the_conversation_the_policy_saw(tmp_path, smollm2_tokenizer):
  write_hf_model(tmp_path / "policy", "llama-mha-tied")
  write_reward_model(tmp_path / "reward", "llama-mha-tied")
  cfg = _config(tmp_path / "policy", tmp_path / "reward")
  scorer, template = _load(cfg, smollm2_tokenizer)
  conversation = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
  assert scorer.conversation({"prompt": conversation}) == conversation
  assert scorer.conversation({"question": "What is 2 * 3?"}) == template.messages("What is 2 * 3?")
  assert tasks.select(cfg.data.dataset_name).template
