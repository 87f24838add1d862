"""Loads the tokenizer (with its chat template) from tokenizer.json, an HF directory, a sentencepiece
model or a GGUF file.

The result is a Hugging Face fast tokenizer, which Tunix's TokenizerAdapter accepts. Its pad token
always differs from EOS, so completions can keep their EOS token and the policy learns to stop.
"""

from __future__ import annotations

import os

import tokenizers
import transformers

from maxtext import assets
from maxtext.checkpoint_conversion import gguf_reader, hf_config
from maxtext.configs.sections import ModelSection
from maxtext.utils import errors

# llama.cpp token types (tokenizer.ggml.token_type)
_GGUF_NORMAL, _GGUF_CONTROL, _GGUF_USER_DEFINED = 1, 3, 4
_PAD_CANDIDATES = ("<|endoftext|>", "<pad>", "<|finetune_right_pad_id|>", "<unk>")
CHAT_TEMPLATE_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "chat_templates"
)
# The chat template for a GGUF file of this architecture that carries none, and the token that ends
# a model turn in it: the tokenizer's EOS with that template (sampling stops at it, and a multi-turn
# conversation continues after it).
_SHIPPED_CHAT_TEMPLATES = {"gemma3": ("gemma3.jinja", "<end_of_turn>")}


def _shipped_chat_template(name: str) -> str:
  """The text of a chat template shipped in configs/chat_templates."""
  with open(os.path.join(CHAT_TEMPLATE_DIR, name), encoding="utf-8") as f:
    return f.read()


def _byte_level_bpe(reader: gguf_reader.GGUFFile, tokens: list[str]) -> tokenizers.Tokenizer:
  """tokenizer.ggml.model "gpt2": byte-level BPE with the file's merges."""
  merges = [tuple(m.split(" ", 1)) for m in gguf_reader.field(reader, "tokenizer.ggml.merges")]
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
  pre = [tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
  if gguf_reader.field(reader, "tokenizer.ggml.pre") == "smollm":
    pre.insert(0, tokenizers.pre_tokenizers.Digits(individual_digits=True))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(pre)
  tok.decoder = tokenizers.decoders.ByteLevel()
  return tok


def _sentencepiece_bpe(reader: gguf_reader.GGUFFile, tokens: list[str], types: list[int]) -> tokenizers.Tokenizer:
  """tokenizer.ggml.model "llama": a SentencePiece BPE vocabulary (pieces, scores, types; no merges).

  SentencePiece's BPE repeatedly joins the adjacent pair whose join is the normal piece of highest
  score; the same as BPE merges ranked by that score, with every split of a piece into two pieces a
  merge. Characters outside the vocabulary fall back to their <0xNN> byte pieces; spaces are '▁'.
  User-defined pieces (newline and space runs, HTML tags) are matched whole before BPE, as
  SentencePiece does; control pieces only as special tokens.
  """
  scores = gguf_reader.field(reader, "tokenizer.ggml.scores")
  vocab = {t: i for i, t in enumerate(tokens)}
  normal = sorted((i for i, ty in enumerate(types) if ty == _GGUF_NORMAL), key=lambda i: (-scores[i], i))
  merges: list[tuple[str, str]] = []
  for i in normal:
    piece = tokens[i]
    merges.extend((piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab)
  unk = gguf_reader.field(reader, "tokenizer.ggml.unknown_token_id")
  bpe = tokenizers.models.BPE(
    vocab=vocab, merges=merges, unk_token=None if unk is None else tokens[unk], byte_fallback=True, fuse_unk=True
  )
  tok = tokenizers.Tokenizer(bpe)
  tok.normalizer = tokenizers.normalizers.Replace(" ", "▁")
  tok.decoder = tokenizers.decoders.Sequence(
    [tokenizers.decoders.Replace("▁", " "), tokenizers.decoders.ByteFallback(), tokenizers.decoders.Fuse()]
  )
  # llama.cpp writes user-defined pieces as raw text (spaces, not '▁'), so they match before normalising.
  tok.add_tokens(
    [tokenizers.AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == _GGUF_USER_DEFINED]
  )
  return tok


def _from_gguf(path: str) -> transformers.PreTrainedTokenizerFast:
  reader = gguf_reader.open_gguf(path)
  model = gguf_reader.field(reader, "tokenizer.ggml.model")
  tokens = gguf_reader.field(reader, "tokenizer.ggml.tokens")
  types = gguf_reader.field(reader, "tokenizer.ggml.token_type")
  if model == "gpt2":
    tok = _byte_level_bpe(reader, tokens)
  elif model == "llama" and gguf_reader.field(reader, "tokenizer.ggml.scores") is not None:
    if gguf_reader.field(reader, "tokenizer.ggml.add_space_prefix", True):
      raise errors.InputError(
        f"{path}: SentencePiece GGUF vocabularies that prepend a space (tokenizer.ggml.add_space_prefix true, "
        "Llama 2 style) are not supported; Gemma 3's is (add_space_prefix false)"
      )
    tok = _sentencepiece_bpe(reader, tokens, types)
  else:
    raise errors.InputError(
      f"{path}: GGUF tokenizer model {model!r} is not supported (expected byte-level BPE 'gpt2' or "
      "SentencePiece 'llama' with scores)"
    )
  tok.add_special_tokens(
    [tokenizers.AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _GGUF_CONTROL]
  )

  def token(key):
    idx = gguf_reader.field(reader, f"tokenizer.ggml.{key}_token_id")
    return None if idx is None else tokens[idx]

  bos, eos = token("bos"), token("eos")
  add_bos = bool(gguf_reader.field(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
  add_eos = bool(gguf_reader.field(reader, "tokenizer.ggml.add_eos_token", False)) and eos is not None
  if add_bos or add_eos:
    first, last = (f"{bos} " if add_bos else ""), (f" {eos}" if add_eos else "")
    tok.post_processor = tokenizers.processors.TemplateProcessing(
      single=f"{first}$A{last}",
      pair=f"{first}$A{last} {first}$B:1{last}",
      special_tokens=[
        (t, tokens.index(t)) for t in dict.fromkeys(x for x, on in ((bos, add_bos), (eos, add_eos)) if on)
      ],
    )
  template = gguf_reader.field(reader, "tokenizer.chat_template")
  arch = gguf_reader.field(reader, "general.architecture")
  if template is None and arch in _SHIPPED_CHAT_TEMPLATES:
    name, eos = _SHIPPED_CHAT_TEMPLATES[arch]
    template = _shipped_chat_template(name)
  return transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok,
    bos_token=bos,
    eos_token=eos,
    unk_token=token("unknown"),
    pad_token=token("padding"),
    chat_template=template,
  )


def _from_sentencepiece(path: str) -> transformers.PreTrainedTokenizerBase:
  """A Llama-style sentencepiece model; the chat template comes from chat_template.jinja or
  tokenizer_config.json beside it."""
  return transformers.LlamaTokenizer.from_pretrained(
    os.path.dirname(path) or ".", vocab_file=path, local_files_only=True
  )


def load_tokenizer(path: str) -> transformers.PreTrainedTokenizerBase:
  """A tokenizer from a .gguf file, a sentencepiece .model file, a tokenizer.json file or an HF
  tokenizer directory (tokenizer.json, or tokenizer.model when there is no tokenizer.json)."""
  if not os.path.exists(path):
    raise errors.MissingInputError(f"tokenizer_path={path}: no such file or directory")
  if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "tokenizer.json")):
    if os.path.isfile(os.path.join(path, "tokenizer.model")):
      path = os.path.join(path, "tokenizer.model")
  tok: transformers.PreTrainedTokenizerBase
  if path.endswith(".gguf"):
    tok = _from_gguf(path)
  elif path.endswith(".model"):
    tok = _from_sentencepiece(path)
  elif os.path.isdir(path) or os.path.basename(path) == "tokenizer.json":
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
      raise errors.MissingInputError(f"tokenizer_path={path}: expected tokenizer.json or tokenizer.model in {folder}")
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
  else:
    raise errors.InputError(
      f"tokenizer_path={path}: expected a .gguf file, a sentencepiece .model file, tokenizer.json or an HF "
      "tokenizer directory"
    )
  if tok.eos_token is None:
    raise errors.InputError(f"tokenizer_path={path}: the tokenizer defines no EOS token")
  if tok.pad_token is None or tok.pad_token_id == tok.eos_token_id:
    vocab = tok.get_vocab()
    pad = next((p for p in _PAD_CANDIDATES if p in vocab and vocab[p] != tok.eos_token_id), None)
    if pad is None:
      raise errors.InputError(f"tokenizer_path={path}: no pad token distinct from EOS ({tok.eos_token})")
    tok.pad_token = pad
  if not tok.chat_template:
    raise errors.InputError(f"tokenizer_path={path}: the tokenizer has no chat template")
  return tok


def tokenizer_path(model: ModelSection) -> str:
  """tokenizer_path, else the HF checkpoint's own tokenizer, else the model's default."""
  if model.tokenizer_path:
    return model.tokenizer_path
  weights = model.load_parameters_path
  if hf_config.is_hf_checkpoint(weights) and any(
    os.path.isfile(os.path.join(weights, f)) for f in ("tokenizer.json", "tokenizer.model")
  ):
    return weights
  if model.model_name in assets.DEFAULT_TOKENIZERS:
    return assets.DEFAULT_TOKENIZERS[model.model_name]()
  raise errors.InputError(f"tokenizer_path: required for model_name={model.model_name} (no default tokenizer)")


def tokenizer_for(model: ModelSection) -> transformers.PreTrainedTokenizerBase:
  """The run's tokenizer, checked against the model's vocabulary, with chat_template's template."""
  path = tokenizer_path(model)
  tok = load_tokenizer(path)
  if len(tok) > model.vocab_size:
    raise errors.InputError(
      f"tokenizer_path={path}: {len(tok)} tokens exceed the model's vocab_size={model.vocab_size}"
    )
  if model.chat_template == "plain":
    _use_plain_template(tok, path)
  return tok


def _use_plain_template(tok: transformers.PreTrainedTokenizerBase, path: str) -> None:
  """The plain-text template (configs/chat_templates/plain.jinja), whose turns end with a blank line:
  the "\n\n" token becomes the EOS, so sampling stops after an answer."""
  ids = tok.encode("\n\n", add_special_tokens=False)
  if len(ids) != 1:
    raise errors.InputError(
      f"chat_template=plain: the tokenizer ({path}) writes a blank line as {len(ids)} tokens; plain prompts "
      "need it to be one token, their turns' end (expected chat_template=model for this tokenizer)"
    )
  tok.chat_template = _shipped_chat_template("plain.jinja")
  tok.eos_token = tok.convert_ids_to_tokens(ids[0])
  if tok.pad_token_id == tok.eos_token_id:
    raise errors.InputError(f"chat_template=plain: the tokenizer's ({path}) pad token is its blank line")
