"""to_maxtext / to_huggingface / decode command lines on checkpoints that transformers writes and reads."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from maxtext import assets
from maxtext.checkpoint_conversion import hf_config, orbax_checkpoint, to_huggingface, to_maxtext
from maxtext.input_pipeline.tokenizer import load_tokenizer
from tests.conftest import make_config


def write_hf_like(model_name, path, dtype=torch.float32):
  """A random transformers model with the architecture of one of our model YAMLs."""
  config = hf_config.to_hf_config(make_config(f"model_name={model_name}").model)
  torch.manual_seed(0)
  config.initializer_range = 0.2
  model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
  model.save_pretrained(path)
  return model


# (torch dtype, weight_dtype, scan_layers of to_maxtext, of to_huggingface): an Orbax checkpoint
# written with the layers stacked or not converts back through a decoder of either layout.
@pytest.mark.parametrize(
  "dtype, weight_dtype, scan_in, scan_out",
  [
    (torch.float32, "float32", "false", "false"),
    (torch.bfloat16, "bfloat16", "false", "false"),
    (torch.float32, "float32", "true", "false"),
    (torch.bfloat16, "bfloat16", "false", "true"),
  ],
)
def test_hf_to_orbax_to_hf_is_bit_exact(tmp_path, dtype, weight_dtype, scan_in, scan_out):
  write_hf_like("qwen3-tiny", tmp_path / "hf", dtype)
  common = ["model_name=qwen3-tiny", f"weight_dtype={weight_dtype}"]
  assert (
    to_maxtext.main(
      [
        "to_maxtext",
        "rl.yml",
        *common,
        f"scan_layers={scan_in}",
        f"load_parameters_path={tmp_path / 'hf'}",
        f"base_output_directory={tmp_path / 'orbax'}",
      ]
    )
    == 0
  )
  assert (tmp_path / "orbax" / "0" / "model_params").is_dir()
  assert orbax_checkpoint.stacked_layers(str(tmp_path / "orbax")) == (scan_in == "true")
  assert (
    to_huggingface.main(
      [
        "to_huggingface",
        "rl.yml",
        *common,
        f"scan_layers={scan_out}",
        f"load_parameters_path={tmp_path / 'orbax'}",
        f"hf_output_path={tmp_path / 'out'}",
      ]
    )
    == 0
  )
  original = load_file(tmp_path / "hf" / "model.safetensors")
  exported = load_file(tmp_path / "out" / "model.safetensors")
  assert set(original) == set(exported)
  for name, value in original.items():
    assert exported[name].dtype == value.dtype, name
    np.testing.assert_array_equal(exported[name], value, err_msg=name)
  assert hf_config.architecture(str(tmp_path / "out")) == hf_config.architecture(str(tmp_path / "hf"))
  tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
  assert tok.chat_template and tok.eos_token == "<|im_end|>"
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
  assert reloaded.dtype == dtype


@pytest.mark.parametrize("engine", ["vanilla", "batched"])
def test_decode_cli_matches_transformers_greedy(tmp_path, engine):
  """decode prints only JSON lines; its tokens equal transformers' greedy decode of the export, with
  either rollout engine."""
  hf = write_hf_like("llama-tiny", tmp_path / "hf")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "maxtext.inference.decode",
      "rl.yml",
      f"load_parameters_path={tmp_path / 'hf'}",
      f"tokenizer_path={assets.smollm2_gguf()}",
      'prompt=["What is 2+3?", "Name a colour."]',
      "max_response_length=12",
      "decode_sampling_temperature=0",
      f"rollout_engine={engine}",
    ],
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  records = [json.loads(line) for line in lines]
  assert [r["prompt"] for r in records] == ["What is 2+3?", "Name a colour."]
  tok = load_tokenizer(assets.smollm2_gguf())
  for r in records:
    ids = tok.apply_chat_template(
      [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
      ref = hf.generate(
        ids, max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
      )[0, ids.shape[1] :].tolist()
    assert r["token_ids"] == ref
    assert r["completion"] == tok.decode([t for t in ref if t != tok.eos_token_id])


def test_to_huggingface_needs_an_output_path(capsys):
  assert to_huggingface.main(["to_huggingface", "rl.yml"]) == 2
  assert "hf_output_path: required" in capsys.readouterr().err


def test_unknown_weights_format_is_an_error(tmp_path, capsys):
  (tmp_path / "weights.bin").write_bytes(b"x")
  assert (
    to_maxtext.main(
      [
        "to_maxtext",
        "rl.yml",
        f"load_parameters_path={tmp_path / 'weights.bin'}",
        f"base_output_directory={tmp_path / 'o'}",
      ]
    )
    == 2
  )
  assert "expected a .gguf file, an HF checkpoint directory" in capsys.readouterr().err


@pytest.mark.slow
def test_gguf_export_reproduces_greedy_decode_in_transformers(tmp_path):
  """The shipped SmolLM2 GGUF exported to HF answers the same as our sampler does."""
  assert to_huggingface.main(["to_huggingface", "rl.yml", f"hf_output_path={tmp_path}"]) == 0
  tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
  model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
  ids = tok.apply_chat_template(
    [{"role": "user", "content": "What is the capital of France?"}],
    add_generation_prompt=True,
    return_tensors="pt",
    return_dict=True,
  )["input_ids"]
  out = model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1] :]
  assert tok.decode(out, skip_special_tokens=True) == "The capital of France is Paris."
