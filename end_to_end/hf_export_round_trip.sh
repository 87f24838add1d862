#!/usr/bin/env bash
# HF export round trip: weights -> HF checkpoint (to_huggingface) -> Orbax (to_maxtext) -> HF again.
# Checks that the two HF checkpoints hold bit-identical tensors, and that transformers loads the
# second one and its greedy decode equals ours (maxtext.inference.decode). Exits non-zero on failure.
# Default: the embedded SmolLM2-135M-Instruct GGUF; CI runs it with model_name=qwen3-tiny.
#   end_to_end/hf_export_round_trip.sh [key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
run() { "$PY" -m "$@" >"$OUT/stdout" 2>"$OUT/log" || { tail -30 "$OUT/log"; exit 1; }; }
PROMPT="What is 2+3?"
run maxtext.checkpoint_conversion.to_huggingface rl.yml hf_output_path="$OUT/hf1" "$@"
run maxtext.checkpoint_conversion.to_maxtext rl.yml load_parameters_path="$OUT/hf1" base_output_directory="$OUT/orbax" "$@"
run maxtext.checkpoint_conversion.to_huggingface rl.yml load_parameters_path="$OUT/orbax" hf_output_path="$OUT/hf2" "$@"
run maxtext.inference.decode rl.yml load_parameters_path="$OUT/hf2" "prompt=$PROMPT" max_response_length=16 \
  decode_sampling_temperature=0 "$@"
"$PY" - "$OUT/hf1" "$OUT/hf2" "$OUT/stdout" "$PROMPT" <<'PYEOF'
import json, sys
import torch, transformers
from safetensors.numpy import load_file
hf1, hf2, decoded, prompt = sys.argv[1:5]
a, b = load_file(f"{hf1}/model.safetensors"), load_file(f"{hf2}/model.safetensors")
assert sorted(a) == sorted(b), set(a) ^ set(b)
differ = [k for k in a if a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes()]
assert not differ, f"tensors differ after the round trip: {differ}"
ours = json.loads(open(decoded, encoding="utf-8").read().strip().splitlines()[-1])
tok = transformers.AutoTokenizer.from_pretrained(hf2)
model = transformers.AutoModelForCausalLM.from_pretrained(hf2)
ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                              return_tensors="pt", return_dict=True)["input_ids"]
with torch.no_grad():
  ref = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
assert ours["token_ids"] == ref, (ours["token_ids"], ref)
print(f"{len(a)} tensors bit-identical; transformers and our greedy decode agree: {ours['completion']!r}")
PYEOF
echo "HF export round trip: OK"
