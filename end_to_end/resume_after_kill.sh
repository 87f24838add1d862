#!/usr/bin/env bash
# Starts a tiny GRPO run, kills it with SIGKILL once its first checkpoint is complete, reruns the same
# command and checks that metrics.jsonl holds every step exactly once. Exits non-zero on failure.
#   end_to_end/resume_after_kill.sh [extra key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
STEPS=4
ARGS=(rl.yml model_name=qwen3-tiny num_batches=$STEPS batch_size=2 rl.num_generations=2 max_response_length=8
      num_test_batches=1 eval_batch_size=2 checkpoint_period=1 base_output_directory="$OUT" run_name=resume "$@")
RUN="$OUT/resume"

"$PY" -m maxtext.trainers.post_train.rl.train_rl "${ARGS[@]}" >"$OUT/first.log" 2>&1 &
PID=$!
for _ in $(seq 1 600); do
  if [ -d "$RUN/checkpoints/actor/1/model_params" ]; then break; fi
  if ! kill -0 "$PID" 2>/dev/null; then echo "first run ended before its first checkpoint"; cat "$OUT/first.log"; exit 1; fi
  sleep 0.5
done
kill -9 "$PID"
wait "$PID" 2>/dev/null || true
echo "killed the first run after checkpoint(s): $(ls "$RUN/checkpoints/actor" | tr '\n' ' ')"

"$PY" -m maxtext.trainers.post_train.rl.train_rl "${ARGS[@]}" >"$OUT/second.log" 2>&1 || { cat "$OUT/second.log"; exit 1; }
grep -q "Resuming from the checkpoint of step" "$OUT/second.log" || { echo "the rerun did not resume"; exit 1; }
"$PY" - "$RUN/metrics.jsonl" "$STEPS" <<'PYEOF'
import json, sys
steps = [json.loads(line)["step"] for line in open(sys.argv[1], encoding="utf-8")]
expected = list(range(1, int(sys.argv[2]) + 1))
print("metrics.jsonl steps:", steps)
sys.exit(0 if steps == expected else f"expected steps {expected}, got {steps}")
PYEOF
echo "resume after kill: OK"
