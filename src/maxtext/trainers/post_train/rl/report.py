"""A run's report: report.md with PNG plots (matplotlib) from its metrics.jsonl, eval.json and config.yml.

    python -m maxtext.trainers.post_train.rl.report <run folder>

rebuilds it at any time (train_rl writes it when a run ends); stdout gets one JSON line naming the
files written. Plots: reward (mean and per function), evaluation accuracy before/during/after
training, KL, loss, response length, step time and, in agentic runs, staleness and tool call and
failure frequency. A plot whose metrics the run did not log is left out; without matplotlib installed
the report has no plots.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
import sys

import yaml

from maxtext.integration.tunix.metrics import ZERO_SIGNAL
from maxtext.trainers.post_train.rl.progress import duration
from maxtext.utils import errors, jsonl, safe_files

_AGGREGATES = {"sum", "std", "mean", "min", "max", "unscored"}
_LENGTH = ("completions/mean_length", "generation/completions/mean_length")
_MAX_LENGTH = ("completions/max_length", "generation/completions/max_length")
_SETTINGS = (
  "model_name",
  "load_parameters_path",
  "dataset_name",
  "num_batches",
  "batch_size",
  "learning_rate",
  "max_prompt_length",
  "max_response_length",
  "rl.num_generations",
  "rl.use_agentic_rollout",
  "rl.off_policy_steps",
  "rl.max_concurrency",
  "rl.tools",
  "rl.max_turns",
)
_EVAL_KEYS = ("accuracy", "partial_accuracy", "format_accuracy")
_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "x")


def _read(run_dir: str) -> tuple[list[dict], dict, dict]:
  """metrics.jsonl rows, eval.json and config.yml of a run folder (empty when absent)."""
  if not os.path.isdir(run_dir):
    raise errors.MissingInputError(f"{run_dir}: no such run folder (expected <base_output_directory>/<run_name>)")
  paths = {name: os.path.join(run_dir, name) for name in ("metrics.jsonl", "eval.json", "config.yml")}
  if not any(os.path.isfile(p) for p in paths.values()):
    raise errors.MissingInputError(f"{run_dir}: not a run folder (no metrics.jsonl, eval.json or config.yml)")
  rows: list[dict] = []
  evals: dict = {}
  config: dict = {}
  if os.path.isfile(paths["metrics.jsonl"]):
    rows = jsonl.read(paths["metrics.jsonl"])
  if os.path.isfile(paths["eval.json"]):
    with open(paths["eval.json"], encoding="utf-8") as f:
      evals = json.load(f)
  if os.path.isfile(paths["config.yml"]):
    with open(paths["config.yml"], encoding="utf-8") as f:
      config = yaml.safe_load(f) or {}
  return rows, evals, config


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
  points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
  return [s for s, _ in points], [v for _, v in points]


def _first_present(rows: list[dict], keys: tuple[str, ...]) -> str | None:
  return next((k for k in keys if any(k in r for r in rows)), None)


def reward_functions(rows: list[dict]) -> list[str]:
  """The per-function reward metrics (rewards/<name>) a run logged, in first-seen order."""
  names = []
  for r in rows:
    for k in r:
      parts = k.split("/")
      if len(parts) == 2 and parts[0] == "rewards" and parts[1] not in _AGGREGATES and k not in names:
        names.append(k)
  return names


def evaluation_points(evals: dict, last_step: int) -> list[tuple[str, int, dict]]:
  """(when, step, summary) for the evaluations before (step 0), during and after training."""
  points = []
  if evals.get("before"):
    points.append(("before", 0, evals["before"]))
  points += [("during", d["step"], d) for d in evals.get("during") or []]
  if evals.get("after"):
    points.append(("after", last_step, evals["after"]))
  if evals.get("checkpoint"):
    points.append(("checkpoint", last_step, evals["checkpoint"]))
  return points


def _plot(path: str, title: str, ylabel: str, lines: list[tuple[str, list, list]], fraction: bool) -> bool:
  """One PNG of step-indexed lines (each its own line style and marker, so equal curves stay
  visible); fraction: the y axis spans [0, 1]. False (nothing written) when no line has a point."""
  lines = [line for line in lines if line[1]]
  if not lines:
    return False
  from matplotlib import ticker
  from matplotlib.figure import Figure

  fig = Figure(figsize=(6.4, 3.6), dpi=100, layout="constrained")
  ax = fig.add_subplot()
  for i, (label, xs, ys) in enumerate(lines):
    ax.plot(
      xs,
      ys,
      linestyle=_STYLES[i % len(_STYLES)],
      marker=_MARKERS[i % len(_MARKERS)] if len(xs) <= 50 else None,
      markersize=5 - i % 3,
      label=label,
    )
  ax.set_title(title)
  ax.set_xlabel("training step")
  ax.set_ylabel(ylabel)
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  if fraction:
    ax.set_ylim(-0.05, 1.05)
  ax.grid(alpha=0.3)
  if len(lines) > 1:
    ax.legend(fontsize="small")
  fig.savefig(path)
  return True


def _plots(rows: list[dict], evals: dict, plot_dir: str) -> list[tuple[str, str]]:
  """Writes the PNGs; returns (title, file name) of each written (none where matplotlib is not
  installed: the report is then text alone)."""
  if importlib.util.find_spec("matplotlib") is None:
    return []
  last_step = max((r["step"] for r in rows), default=0)
  line = lambda key, label=None: (label or key, *_series(rows, key))
  length, max_length = _first_present(rows, _LENGTH), _first_present(rows, _MAX_LENGTH)
  evaluation = evaluation_points(evals, last_step)
  specs = [
    (
      "reward.png",
      "Reward",
      "reward",
      [line("rewards/mean", "mean (all functions)")] + [line(k, k.split("/", 1)[1]) for k in reward_functions(rows)],
      False,
    ),
    (
      "accuracy.png",
      "Evaluation accuracy (before, during, after training)",
      "fraction of questions",
      [
        (k.replace("_", " "), [s for _, s, _ in evaluation], [e[k] for _, _, e in evaluation])
        for k in _EVAL_KEYS
        if evaluation and all(k in e for _, _, e in evaluation)
      ],
      True,
    ),
    ("kl.png", "KL divergence to the reference model", "KL", [line("kl")], False),
    ("loss.png", "Loss", "loss", [line("loss"), line("pg_loss", "policy-gradient loss")], False),
    (
      "response_length.png",
      "Response length",
      "tokens",
      [line(k, label) for k, label in ((length, "mean"), (max_length, "max")) if k],
      False,
    ),
    (
      "step_time.png",
      "Step time",
      "seconds",
      [line("step_time_s", "step"), line("compile_s", "of it compiling")],
      False,
    ),
    (
      "staleness.png",
      "Staleness (policy versions behind)",
      "versions",
      [line("staleness/mean", "mean"), line("staleness/max", "max")],
      False,
    ),
    (
      "tools.png",
      "Tool calls",
      "fraction",
      [
        line("tools/call_frequency", "call frequency (conversations)"),
        line("tools/failure_frequency", "failure frequency (calls)"),
      ],
      True,
    ),
  ]
  os.makedirs(plot_dir, exist_ok=True)
  written = []
  for name, title, ylabel, lines, fraction in specs:
    if _plot(os.path.join(plot_dir, name), title, ylabel, lines, fraction):
      written.append((title, name))
  return written


def _setting(config: dict, dotted: str):
  value = config
  for part in dotted.split("."):
    if not isinstance(value, dict) or part not in value:
      return None
    value = value[part]
  return value


def _fmt(value) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return "" if value is None else str(value)


def _markdown(run_dir: str, rows: list[dict], evals: dict, config: dict, plots: list[tuple[str, str]]) -> str:
  name = config.get("run_name") or os.path.basename(os.path.normpath(run_dir))
  out = [
    f"# GRPO run `{name}`",
    "",
    f"Written {datetime.datetime.now().isoformat(timespec='seconds')} from `{run_dir}` by "
    "`python -m maxtext.trainers.post_train.rl.report`.",
    "",
  ]
  last_step = max((r["step"] for r in rows), default=0)
  out += _settings_section(config) + _evaluation_section(evals, config, last_step)
  out += _samples_section(evals, last_step) + _training_section(rows, last_step) + _plots_section(plots)
  return "\n".join(out)


def _settings_section(config: dict) -> list[str]:
  settings = [(k, _setting(config, k)) for k in _SETTINGS]
  if not any(v not in (None, "") for _, v in settings):
    return []
  return [
    "## Settings",
    "",
    "| key | value |",
    "| --- | --- |",
    *(f"| {k} | {_fmt(v)} |" for k, v in settings if v not in (None, "")),
    "",
    "Every resolved key is in config.yml.",
    "",
  ]


def _evaluation_section(evals: dict, config: dict, last_step: int) -> list[str]:
  if config.get("num_test_batches") == 0:
    return ["## Evaluation", "", "None: the run was configured without evaluation (num_test_batches=0).", ""]
  evaluation = evaluation_points(evals, last_step)
  if not evaluation:
    return []
  out = [
    "## Evaluation",
    "",
    "| when | step | accuracy | partial accuracy | format accuracy | questions |",
    "| --- | --- | --- | --- | --- | --- |",
  ]
  out += [
    f"| {when} | {step} | " + " | ".join(_fmt(e.get(k)) for k in (*_EVAL_KEYS, "num_examples")) + " |"
    for when, step, e in evaluation
  ]
  out.append("")
  gain = evals.get("gain")
  if gain:
    clear = "an improvement" if gain["ci95_low"] > 0 else "a loss" if gain["ci95_high"] < 0 else "no clear change"
    out += [
      f"Accuracy gain after training: **{gain['gain']:+.3f}** (95% interval [{gain['ci95_low']:+.3f}, "
      f"{gain['ci95_high']:+.3f}], paired bootstrap over the same {gain['num_examples']} questions; "
      f"{gain['improved']} improved, {gain['worsened']} worsened): {clear}.",
      "",
    ]
  return out


SAMPLES = 3  # questions shown per evaluation, the same ones at every evaluation
_SAMPLE_CHARS = 400  # of a completion shown (its start)
_FENCE = "`" * 3


def _samples_section(evals: dict, last_step: int) -> list[str]:
  """The first SAMPLES questions of each evaluation with the policy's completion (its first pass), the
  reference answer and whether it was judged correct, so a reader sees what the numbers mean."""
  points = [(when, step, (e.get("examples") or [])[:SAMPLES]) for when, step, e in evaluation_points(evals, last_step)]
  points = [p for p in points if p[2]]
  if not points:
    return []
  out = ["## Sample completions", ""]
  for when, step, examples in points:
    out += [f"### {when} (step {step})", ""]
    for i, ex in enumerate(examples, 1):
      passes = ex.get("passes") or [{}]
      completion = str(passes[0].get("completion", ""))
      shown = completion[:_SAMPLE_CHARS] + (" ..." if len(completion) > _SAMPLE_CHARS else "")
      verdict = "correct" if ex.get("correct") else "partially correct" if ex.get("partially_correct") else "wrong"
      question = " ".join(str(ex.get("question", "")).split())
      lines = shown.replace(_FENCE, "'''").splitlines() or [""]
      out += [
        f"{i}. {question} (answer `{ex.get('answer')}`): **{verdict}**",
        "",
        f"   {_FENCE}text",
        *(f"   {line}" for line in lines),
        f"   {_FENCE}",
        "",
      ]
  out += ["Every question's completions and verdicts are in eval.json.", ""]
  return out


def _training_section(rows: list[dict], last_step: int) -> list[str]:
  if not rows:
    return []
  keys = [
    "rewards/mean",
    *reward_functions(rows),
    ZERO_SIGNAL,
    "kl",
    "loss",
    _first_present(rows, _LENGTH),
    "step_time_s",
    "compile_s",
    "staleness/mean",
    "staleness/max",
    "tools/call_frequency",
    "tools/failure_frequency",
    "turns/mean",
    "agent/failed_episodes",
    "agent/calls_per_episode",
    "agent/reward",
    "agent/mismatched_calls",
    "agent/branched_calls",
    "agent/retried_calls",
    "agent/cut_tokens",
  ]
  out = [
    f"## Training ({len(rows)} steps logged, last step {last_step})",
    "",
    "| metric | first | last | min | max |",
    "| --- | --- | --- | --- | --- |",
  ]
  for key in keys:
    _, values = _series(rows, key) if key else ([], [])
    if values:
      out.append(f"| {key} | {_fmt(values[0])} | {_fmt(values[-1])} | {_fmt(min(values))} | {_fmt(max(values))} |")
  _, times = _series(rows, "step_time_s")
  _, compiling = _series(rows, "compile_s")
  if times:
    out += [
      "",
      f"Training wall time: {duration(sum(times))} over {len(times)} steps ({duration(sum(compiling))} of it "
      f"compiling; {duration(sum(times) / len(times))} a step).",
    ]
  out += [
    "",
    "Every metric of every step is in metrics.jsonl (and TensorBoard events under tensorboard/).",
    "Every episode trained (its conversation, token counts, reward, status and failure) is in episodes.jsonl.",
    "",
  ]
  _, no_signal = _series(rows, ZERO_SIGNAL)
  if no_signal and sum(no_signal) / len(no_signal) > 0.5:
    out += [
      f"**Warning:** on average {100 * sum(no_signal) / len(no_signal):.0f}% of the groups per step had equal "
      f"rewards ({ZERO_SIGNAL}), which gives them zero advantage: most samples carried no learning signal. "
      "Make the task easier or harder for the model, or raise rl.num_generations.",
      "",
    ]
  return out


def _plots_section(plots: list[tuple[str, str]]) -> list[str]:
  if not plots:
    return []
  out = ["## Plots", ""]
  for title, file in plots:
    out += [f"### {title}", "", f"![{title}](plots/{file})", ""]
  return out


def write(run_dir: str) -> dict:
  """Writes <run_dir>/report.md and <run_dir>/plots/*.png; returns their paths."""
  rows, evals, config = _read(run_dir)
  plot_dir = os.path.join(run_dir, "plots")
  plots = _plots(rows, evals, plot_dir)
  path = os.path.join(run_dir, "report.md")
  with safe_files.replaced(path) as f:
    f.write(_markdown(run_dir, rows, evals, config, plots))
  return {"report": path, "plots": [os.path.join(plot_dir, file) for _, file in plots]}


def main(argv: list[str]) -> int:
  if len(argv) != 2 or argv[1] in ("-h", "--help"):
    print(__doc__.strip(), file=sys.stderr if len(argv) != 2 else sys.stdout)
    return 0 if len(argv) == 2 else 2
  try:
    written = write(argv[1])
  except errors.InputError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(written))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
