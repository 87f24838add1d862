"""HF checkpoint folders: a weights file cut short (a copy interrupted, a download that stopped) is
one line naming the file, and train_rl exits 2 on it before training."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from maxtext import assets
from maxtext.checkpoint_conversion import hf_checkpoint
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import errors
from tests.conftest import make_config


def _cut(path, keep: int) -> None:
  data = path.read_bytes()
  path.write_bytes(data[: keep if keep >= 0 else len(data) + keep])


@pytest.mark.parametrize("keep", [0, 4, 40, -100], ids=["empty", "in-the-length", "in-the-header", "in-the-data"])
def test_a_truncated_safetensors_file_is_named(tmp_path, keep):
  weights = tmp_path / "model.safetensors"
  save_file({"a": np.ones((64, 64), np.float32), "b": np.arange(10, dtype=np.float32)}, str(weights))
  assert sorted(hf_checkpoint.read_state_dict(str(tmp_path))) == ["a", "b"]
  _cut(weights, keep)
  with pytest.raises(errors.InputError) as raised:
    hf_checkpoint.read_state_dict(str(tmp_path))
  assert str(raised.value).startswith(f"{weights}: not a complete safetensors file, truncated or damaged (")
  assert "\n" not in str(raised.value)


def test_a_damaged_index_is_named(tmp_path):
  (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-0')
  with pytest.raises(errors.InputError, match=r"model.safetensors.index.json: not a safetensors index"):
    hf_checkpoint.read_state_dict(str(tmp_path))


def test_train_rl_on_a_truncated_checkpoint_exits_2_naming_the_file(tmp_path, capsys):
  """An HF folder of qwen3-tiny's architecture whose model.safetensors is cut: the weights are read
  before anything trains or is saved."""
  folder = tmp_path / "qwen3-tiny-hf"
  hf_checkpoint.write(str(folder), {"model.embed_tokens.weight": np.zeros((1024, 64), np.float32)}, _tiny())
  _cut(folder / "model.safetensors", -1000)
  data = tmp_path / "data.jsonl"
  data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(8)))
  args = [
    "train_rl",
    "rl.yml",
    f"load_parameters_path={folder}",
    f"tokenizer_path={assets.qwen3_tokenizer_dir()}",
    f"dataset_name={data}",
    "num_batches=1",
    "num_test_batches=0",
    f"base_output_directory={tmp_path / 'runs'}",
  ]
  assert train_rl.main(args) == 2
  err = capsys.readouterr().err
  assert (
    err.strip()
    .splitlines()[-1]
    .startswith(f"error: {folder / 'model.safetensors'}: not a complete safetensors file, truncated or damaged (")
  )
  assert "Traceback" not in err and not os.path.exists(tmp_path / "runs" / "default_run" / "checkpoints")


def _tiny():
  return make_config("model_name=qwen3-tiny").model


WRITE_SLOWLY = """
import sys, time
import numpy as np
from safetensors import numpy as safetensors_np
from maxtext.checkpoint_conversion import hf_checkpoint
from tests.conftest import make_config

def save_file(state, path, metadata=None):  # half a weights file, then a wait to be killed in
    with open(path, "wb") as f:
        f.write(b"partial")
        f.flush()
    print("writing", flush=True)
    time.sleep(60)

safetensors_np.save_file = save_file
cfg = make_config("model_name=qwen3-tiny")
hf_checkpoint.write(sys.argv[1], {"w": np.zeros(4, np.float32)}, cfg.model)
"""


def test_a_writer_killed_while_it_writes_leaves_the_folder_it_replaces_whole(tmp_path):
  """SIGKILL while model.safetensors is half written: the previous checkpoint at the path is as it was
  (train_reward_model's reward_training.output_path, hf_output_path); a write that finishes replaces it."""
  import signal
  import subprocess
  import sys

  cfg = make_config("model_name=qwen3-tiny")
  path = tmp_path / "reward_model"
  hf_checkpoint.write(str(path), {"w": np.arange(4, dtype=np.float32)}, cfg.model)
  before = {p.name: p.read_bytes() for p in path.iterdir()}
  script = tmp_path / "write_slowly.py"
  script.write_text(WRITE_SLOWLY)
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
  writer = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True, env=env)
  try:
    assert writer.stdout.readline().strip() == "writing"
  finally:
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
  assert {p.name: p.read_bytes() for p in path.iterdir()} == before
  np.testing.assert_array_equal(hf_checkpoint.read_state_dict(str(path))["w"], np.arange(4, dtype=np.float32))
  hf_checkpoint.write(str(path), {"w": np.ones(4, np.float32)}, cfg.model)
  np.testing.assert_array_equal(hf_checkpoint.read_state_dict(str(path))["w"], np.ones(4, np.float32))
  assert sorted(p.name for p in tmp_path.iterdir() if ".old-" in p.name) == []  # the replaced folder is gone
