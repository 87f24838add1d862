#!/usr/bin/env bash
# Standard GRPO smoke test: a tiny qwen3 run of 3 steps through train_rl, then checks the run folder:
# every step once in metrics.jsonl with finite rewards and loss, eval.json before/after, the last
# checkpoint, report.md and its plots. Exits non-zero on failure.
#   end_to_end/standard_grpo_smoke.sh [extra key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
STEPS=3
"$PY" -m maxtext.trainers.post_train.rl.train_rl rl.yml model_name=qwen3-tiny num_batches=$STEPS batch_size=2 \
  rl.num_generations=2 max_response_length=16 num_test_batches=1 eval_batch_size=2 base_output_directory="$OUT" \
  run_name=smoke "$@" >"$OUT/stdout" 2>"$OUT/log" || { tail -50 "$OUT/log"; exit 1; }
"$PY" - "$OUT/smoke" "$STEPS" "$OUT/stdout" <<'PYEOF'
import json, math, os, sys
run, steps = sys.argv[1], int(sys.argv[2])
rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"), encoding="utf-8")]
assert [r["step"] for r in rows] == list(range(1, steps + 1)), [r["step"] for r in rows]
for r in rows:
  for key in ("rewards/mean", "loss", "kl", "step_time_s"):
    assert math.isfinite(r[key]), (r["step"], key, r.get(key))
summary = json.loads(open(sys.argv[3], encoding="utf-8").read().strip().splitlines()[-1])
evals = json.load(open(os.path.join(run, "eval.json"), encoding="utf-8"))
assert evals["before"]["num_examples"] == evals["after"]["num_examples"] == 2 and summary["after"]
assert os.path.isdir(os.path.join(run, "checkpoints", "actor", str(steps), "model_params"))
report = open(os.path.join(run, "report.md"), encoding="utf-8").read()
for png in ("reward", "accuracy", "kl", "loss", "response_length", "step_time"):
  assert os.path.getsize(os.path.join(run, "plots", png + ".png")) > 1000 and f"plots/{png}.png" in report, png
print(f"{steps} steps; rewards/mean {[r['rewards/mean'] for r in rows]}; accuracy after {summary['after']['accuracy']}")
PYEOF
echo "standard GRPO smoke: OK"
