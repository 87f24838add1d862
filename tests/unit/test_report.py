"""report.md and its plots from a run folder's files, and the report command's errors."""

import json

import yaml
from PIL import Image

from maxtext.trainers.post_train.rl import report

ROWS = [
  {
    "step": 1,
    "rewards/mean": -0.5,
    "rewards/check_answer": 0.0,
    "rewards/sum": -4.0,
    "kl": 0.0,
    "loss": 0.1,
    "generation/completions/mean_length": 30.0,
    "step_time_s": 12.0,
    "compile_s": 9.0,
    "staleness/mean": 0.0,
    "staleness/max": 0,
    "tools/call_frequency": 0.5,
    "tools/failure_frequency": 0.0,
    "turns/mean": 1.5,
  },
  {
    "step": 2,
    "rewards/mean": 0.25,
    "rewards/check_answer": 1.5,
    "rewards/sum": 2.0,
    "kl": 0.002,
    "loss": float("nan"),
    "generation/completions/mean_length": 24.0,
    "step_time_s": 3.0,
    "compile_s": 0.5,
    "staleness/mean": 0.5,
    "staleness/max": 1,
    "tools/call_frequency": 2 / 3,
    "tools/failure_frequency": 0.5,
    "turns/mean": 2.0,
  },
  {
    "step": 3,
    "rewards/mean": 1.0,
    "rewards/check_answer": 3.0,
    "rewards/sum": 8.0,
    "kl": 0.004,
    "loss": 0.3,
    "generation/completions/mean_length": 20.0,
    "step_time_s": 3.5,
    "compile_s": 0.0,
    "staleness/mean": 1.0,
    "staleness/max": 1,
    "tools/call_frequency": 1.0,
    "tools/failure_frequency": 0.25,
    "turns/mean": 2.0,
  },
]
EVAL = {
  "before": {"accuracy": 0.1, "partial_accuracy": 0.2, "format_accuracy": 0.3, "num_examples": 10},
  "during": [{"step": 2, "accuracy": 0.2, "partial_accuracy": 0.3, "format_accuracy": 0.5, "num_examples": 10}],
  "after": {"accuracy": 0.4, "partial_accuracy": 0.5, "format_accuracy": 0.9, "num_examples": 10},
}


def _run_folder(path, rows=ROWS, evals=EVAL):
  path.mkdir(parents=True, exist_ok=True)
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (path / "eval.json").write_text(json.dumps(evals))
  (path / "config.yml").write_text(
    yaml.safe_dump(
      {"run_name": "r1", "model_name": "qwen3-0.6b", "rl": {"use_agentic_rollout": True, "off_policy_steps": 1}}
    )
  )
  return path


def test_agentic_run_gets_every_plot_and_hand_checked_tables(tmp_path, capsys):
  run = _run_folder(tmp_path / "r1")
  assert report.main(["report", str(run)]) == 0
  written = json.loads(capsys.readouterr().out)
  names = [p.rsplit("/", 1)[1] for p in written["plots"]]
  assert names == [
    "reward.png",
    "accuracy.png",
    "kl.png",
    "loss.png",
    "response_length.png",
    "step_time.png",
    "staleness.png",
    "tools.png",
  ]
  for p in written["plots"]:
    with Image.open(p) as image:
      assert image.format == "PNG" and image.size == (640, 360)
  md = (run / "report.md").read_text()
  assert md.startswith("# GRPO run `r1`")
  assert "| model_name | qwen3-0.6b |" in md and "| rl.off_policy_steps | 1 |" in md
  assert "| before | 0 | 0.1 | 0.2 | 0.3 | 10 |" in md
  assert "| during | 2 | 0.2 | 0.3 | 0.5 | 10 |" in md
  assert "| after | 3 | 0.4 | 0.5 | 0.9 | 10 |" in md  # after training = the last logged step
  assert "| rewards/mean | -0.5 | 1 | -0.5 | 1 |" in md
  assert "| rewards/check_answer | 0 | 3 | 0 | 3 |" in md
  assert "rewards/sum" not in md  # an aggregate, not a reward function
  assert "| loss | 0.1 | 0.3 | 0.1 | 0.3 |" in md  # the NaN of step 2 is left out
  assert "| tools/failure_frequency | 0 | 0.25 | 0 | 0.5 |" in md
  assert "| staleness/max | 0 | 1 | 0 | 1 |" in md
  assert "| compile_s | 9 | 0 | 0 | 9 |" in md
  assert all(f"](plots/{n})" in md for n in names)


def test_standard_run_has_no_agentic_plots(tmp_path):
  rows = [{k: v for k, v in r.items() if not k.startswith(("staleness", "tools", "turns"))} for r in ROWS]
  written = report.write(str(_run_folder(tmp_path / "std", rows, {"before": EVAL["before"]})))
  names = {p.rsplit("/", 1)[1] for p in written["plots"]}
  assert "staleness.png" not in names and "tools.png" not in names and "reward.png" in names
  assert report.reward_functions(rows) == ["rewards/check_answer"]


def test_errors_name_the_folder_or_file(tmp_path, capsys):
  assert report.main(["report", str(tmp_path / "missing")]) == 2
  assert "missing: no such run folder" in capsys.readouterr().err
  assert report.main(["report", str(tmp_path)]) == 2
  assert "not a run folder (no metrics.jsonl, eval.json or config.yml)" in capsys.readouterr().err
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, \n')
  assert report.main(["report", str(tmp_path)]) == 2
  assert "metrics.jsonl:2: not valid JSON" in capsys.readouterr().err
  assert report.main(["report"]) == 2


def test_gain_interval_and_no_signal_warning(tmp_path):
  """eval.json's paired gain is stated with its interval; a run where most groups had equal rewards
  (frac_reward_zero_std) gets a warning."""
  rows = [{**r, "frac_reward_zero_std": f} for r, f in zip(ROWS, (1.0, 0.75, 0.5))]
  gain = {"gain": 0.3, "ci95_low": 0.1, "ci95_high": 0.5, "num_examples": 10, "improved": 4, "worsened": 1}
  run = _run_folder(tmp_path / "r1", rows=rows, evals={**EVAL, "gain": gain})
  text = open(report.write(str(run))["report"], encoding="utf-8").read()
  assert "Accuracy gain after training: **+0.300** (95% interval [+0.100, +0.500]" in text
  assert "an improvement" in text
  assert "| frac_reward_zero_std | 1 | 0.5 | 0.5 | 1 |" in text
  assert "**Warning:** on average 75% of the groups per step had equal rewards" in text
  quiet = _run_folder(tmp_path / "r2", rows=[{**r, "frac_reward_zero_std": 0.25} for r in ROWS])
  assert "Warning" not in open(report.write(str(quiet))["report"], encoding="utf-8").read()


def test_without_matplotlib_the_report_is_text_alone(tmp_path, monkeypatch):
  """Where matplotlib is not installed (an accelerator image given only the wheels the device suite
  needs), report.md is still written, with its tables and no plots."""
  find_spec = report.importlib.util.find_spec
  monkeypatch.setattr(report.importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else find_spec(n, *a))
  written = report.write(str(_run_folder(tmp_path / "run")))
  text = open(written["report"], encoding="utf-8").read()
  assert written["plots"] == [] and "## Plots" not in text and "|" in text
  assert not (tmp_path / "run" / "plots").exists() or not list((tmp_path / "run" / "plots").iterdir())


def test_report_shows_sample_completions_per_evaluation_and_the_training_wall_time(tmp_path):
  examples = [
    {
      "question": f"What is {i} + {i}?",
      "answer": str(2 * i),
      "correct": i == 1,
      "partially_correct": False,
      "passes": [{"completion": f"<answer>{2 * i if i == 1 else 0}</answer>" + ("x" * 500 if i == 2 else "")}],
    }
    for i in range(5)
  ]
  evals = {k: ({**v, "examples": examples} if isinstance(v, dict) else v) for k, v in EVAL.items()}
  evals["during"] = [{**evals["during"][0], "examples": examples}]
  report.write(str(_run_folder(tmp_path / "r1", evals=evals)))
  text = (tmp_path / "r1" / "report.md").read_text()
  samples = text.split("## Sample completions\n")[1].split("\n## ")[0]
  assert [line for line in samples.splitlines() if line.startswith("### ")] == [
    "### before (step 0)",
    "### during (step 2)",
    "### after (step 3)",
  ]
  assert samples.count("1. What is 0 + 0? (answer `0`): **wrong**") == 3
  assert samples.count("2. What is 1 + 1? (answer `2`): **correct**") == 3
  assert "What is 3 + 3?" not in samples  # three questions per evaluation
  assert "   <answer>2</answer>" in samples and "x" * 380 + " ..." in samples and "x" * 401 not in samples
  # 12 + 3 + 3.5 s of steps, 9.5 s of it compiling
  assert "Training wall time: 18 s over 3 steps (9.5 s of it compiling; 6.2 s a step)." in text
