"""Evaluation: pass@k, majority and pass@1 on constructed response lists; the evaluate_rl command."""

import json

import pytest

from maxtext import tasks
from maxtext.trainers.post_train.rl import evaluate_rl
from tests.conftest import make_config

RIGHT = "<reasoning>r</reasoning><answer>42</answer>"
NEAR = "<reasoning>r</reasoning><answer>44</answer>"
WRONG = "<reasoning>r</reasoning><answer>7</answer>"
UNFORMATTED = "the answer is <answer>7</answer>"


def _examples(n):
  return [{"prompts": f"p{i}", "question": f"q{i}", "answer": "42"} for i in range(n)]


def _evaluate(generate, examples, cfg):
  score = evaluate_rl.scorer(tasks.select(cfg.data.dataset_name), cfg.task)
  return evaluate_rl.evaluate(generate, examples, score, cfg.eval, "t")


def _scripted(passes):
  """generate() that returns passes[k][i] for example i on the k-th call per batch."""
  calls = {"n": 0}

  def generate(prompts):
    k = calls["n"]
    calls["n"] += 1
    return [passes[k][int(p[1:])] for p in prompts]

  return generate


# PASSES[k][i]: pass k of question i. q0 is right in pass 1, q1 in pass 3, q2 never (near twice).
PASSES = [
  [RIGHT, WRONG, NEAR],
  [WRONG, WRONG, NEAR],
  [WRONG, RIGHT, UNFORMATTED],
]


@pytest.mark.parametrize(
  "mode, accuracy, partial, fmt",
  [
    ("pass", 2 / 3, 1.0, 1.0),  # any pass: q0 yes, q1 yes, q2 no (44 is near)
    ("maj", 0.0, 1 / 3, 1.0),  # majority answers: q0 7, q1 7, q2 44
    ("pass_at_1", (1 / 3 + 1 / 3 + 0) / 3, (1 / 3 + 1 / 3 + 2 / 3) / 3, (1 + 1 + 2 / 3) / 3),
  ],
)
def test_eval_modes(mode, accuracy, partial, fmt):
  cfg = make_config("num_eval_passes=3", f"eval_mode={mode}", "eval_batch_size=8")
  result = _evaluate(_scripted(PASSES), _examples(3), cfg)
  assert result["accuracy"] == pytest.approx(accuracy)
  assert result["partial_accuracy"] == pytest.approx(partial)
  assert result["format_accuracy"] == pytest.approx(fmt)
  assert result["num_examples"] == 3 and result["eval_mode"] == mode
  assert [len(e["passes"]) for e in result["examples"]] == [3, 3, 3]


def test_eval_make_lst_false_drops_records():
  cfg = make_config("eval_make_lst=false")
  result = _evaluate(_scripted([[RIGHT, WRONG]]), _examples(2), cfg)
  assert "examples" not in result and result["accuracy"] == 0.5


def test_evaluate_rl_command_prints_json_last(tmp_path, capsys):
  args = [
    "evaluate_rl",
    "rl.yml",
    "model_name=qwen3-tiny",
    "num_test_batches=1",
    "eval_batch_size=2",
    "max_response_length=8",
    "eval_sampling_strategy=standard",
    "num_eval_passes=2",
    "eval_mode=maj",
    f"base_output_directory={tmp_path}",
    "run_name=ev",
  ]
  assert evaluate_rl.main(args) == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert set(summary) >= {"accuracy", "partial_accuracy", "format_accuracy", "num_examples", "eval_mode"}
  assert summary["num_examples"] == 2 and summary["eval_mode"] == "maj"
  saved = json.loads((tmp_path / "ev" / "eval.json").read_text())
  assert len(saved["checkpoint"]["examples"][0]["passes"]) == 2


def test_bad_eval_mode_is_a_config_error():
  with pytest.raises(ValueError, match="eval_mode='best': expected one of pass, maj, pass_at_1"):
    make_config("eval_mode=best")


def _records(correct):
  return {"examples": [{"question": f"q{i}", "correct": c} for i, c in enumerate(correct)]}


def test_paired_gain_and_its_bootstrap_interval_by_hand():
  """8 questions: 3 turn right, 1 turns wrong, 4 stay: gain (3 - 1) / 8; the bootstrap interval holds
  it and is about the normal one, 1.96 * sd(d) / sqrt(n) with sd(d) = 0.66 (0.25 +- 0.46)."""
  before = _records([0, 0, 0, 1, 1, 0, 1, 0])
  after = _records([1, 1, 1, 0, 1, 0, 1, 0])
  g = evaluate_rl.paired_gain(before, after)
  assert (g["gain"], g["improved"], g["worsened"], g["num_examples"]) == (0.25, 3, 1, 8)
  assert -0.3 < g["ci95_low"] < 0 < 0.5 < g["ci95_high"] <= 0.75
  clear = evaluate_rl.paired_gain(_records([0] * 40), _records([1] * 12 + [0] * 28))
  assert clear["gain"] == pytest.approx(0.3) and clear["ci95_low"] > 0.1  # every change is a gain
  assert evaluate_rl.paired_gain(before, _records([1] * 7)) is None  # not the same questions
  assert evaluate_rl.paired_gain({"accuracy": 0.1}, after) is None  # eval_make_lst=false
