#!/usr/bin/env bash
# Agentic GRPO smoke test: a tiny qwen3 run of 3 steps with asynchronous rollouts (off_policy_steps=1,
# max_concurrency=8) and the calculator tool, then checks every step once in metrics.jsonl, staleness
# within the bound, tool metrics, and the agentic plots of report.md. Exits non-zero on failure.
#   end_to_end/agentic_grpo_smoke.sh [extra key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
STEPS=3
OFF_POLICY=1
"$PY" -m maxtext.trainers.post_train.rl.train_rl rl.yml model_name=qwen3-tiny num_batches=$STEPS batch_size=2 \
  rl.num_generations=2 max_prompt_length=512 max_response_length=16 num_test_batches=1 eval_batch_size=2 \
  rl.use_agentic_rollout=true rl.off_policy_steps=$OFF_POLICY rl.max_concurrency=8 "rl.tools=[calculator]" \
  rl.max_turns=2 base_output_directory="$OUT" run_name=agentic "$@" >"$OUT/stdout" 2>"$OUT/log" \
  || { tail -50 "$OUT/log"; exit 1; }
"$PY" - "$OUT/agentic" "$STEPS" "$OFF_POLICY" <<'PYEOF'
import json, math, os, sys
run, steps, bound = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"), encoding="utf-8")]
assert [r["step"] for r in rows] == list(range(1, steps + 1)), [r["step"] for r in rows]
for r in rows:
  assert math.isfinite(r["loss"]) and math.isfinite(r["rewards/mean"]), r
  assert 0 <= r["staleness/max"] <= bound, ("staleness", r["step"], r["staleness/max"])
  assert 0 <= r["tools/call_frequency"] <= 1 and 0 <= r["tools/failure_frequency"] <= 1 and r["turns/mean"] >= 1
report = open(os.path.join(run, "report.md"), encoding="utf-8").read()
for png in ("staleness", "tools"):
  assert os.path.getsize(os.path.join(run, "plots", png + ".png")) > 1000 and f"plots/{png}.png" in report, png
print(f"{steps} steps; staleness/max {[r['staleness/max'] for r in rows]}; "
      f"tool calls {[round(r['tools/call_frequency'], 2) for r in rows]}")
PYEOF
echo "agentic GRPO smoke: OK"
