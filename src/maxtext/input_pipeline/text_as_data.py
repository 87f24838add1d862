"""Text that users, agents, tools or environments wrote, tokenized as text: only a template writes
control tokens. `TextAsData` holds what in such text spells a control token out of a rendering and
encodes it as plain text after; `Rendered` is a rendered prompt's text with the ids so encoded, what
the samplers take (integration/tunix/rollout.tokenized) and `prompt_ids` counts, while reward
functions and logs read the text."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

_HOLD_OPEN, _HOLD_CLOSE = "\ue000", "\ue001"  # private-use characters around a held control string's number
_HELD = re.compile(f"{_HOLD_OPEN}(\\d+){_HOLD_CLOSE}")


@functools.lru_cache(maxsize=8)
def _control_pattern(tokenizer) -> re.Pattern:
  """What in a text would become a control token: the tokenizer's special tokens (its special added
  tokens: ChatML's <|im_start|>, Gemma's <start_of_turn>, EOS and the like), and the hold markers."""
  special = {*tokenizer.all_special_tokens, *(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)}
  names = sorted((t for t in special if t), key=len, reverse=True)
  return re.compile("|".join([*map(re.escape, names), _HOLD_OPEN, _HOLD_CLOSE]))


class TextAsData:
  """Text that users, agents, tools or environments wrote, tokenized as text: what in it spells a
  control token (`_control_pattern`) is held out before the template renders (`protect` puts a
  numbered marker in its place) and encoded as plain text after (`encode`: the rendered text's
  pieces as the tokenizer encodes them, each held string with its special tokens split), so only the
  template writes control tokens. Text without such strings encodes exactly as the tokenizer encodes
  it. Non-special added tokens (Qwen's <tool_call> and <think>) stay the tokens they are, as the
  model writes them."""

  def __init__(self, tokenizer):
    self._tokenizer = tokenizer
    self._pattern = _control_pattern(tokenizer)
    self._held: list[str] = []

  @property
  def held(self) -> bool:
    """Whether `protect` held out a control string."""
    return bool(self._held)

  def protect(self, value: Any) -> Any:
    """`value` (a string, or lists and dicts of them, as messages and tool schemas are) with each
    control string in its strings held out."""
    if isinstance(value, str):
      return self._pattern.sub(self._hold, value)
    if isinstance(value, dict):
      return {k: self.protect(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
      return [self.protect(v) for v in value]
    return value

  def _hold(self, match: re.Match) -> str:
    self._held.append(match.group(0))
    return f"{_HOLD_OPEN}{len(self._held) - 1}{_HOLD_CLOSE}"

  def encode(self, text: str) -> list[int]:
    """The ids of `text` (rendered from protected values): its held strings as plain text."""
    encode = lambda piece, **kw: list(self._tokenizer(piece, add_special_tokens=False, **kw).input_ids)
    if not self._held:
      return encode(text)
    ids: list[int] = []
    for i, piece in enumerate(_HELD.split(text)):
      if i % 2:
        ids += encode(self._held[int(piece)], split_special_tokens=True)
      elif piece:
        ids += encode(piece)
    return ids


class Rendered(str):
  """A prompt's text (a str: what reward functions, logs and episode records read) with its token
  ids (`ids`), in which the data's text is encoded as text (TextAsData), without the special tokens
  the tokenizer adds (its BOS): the samplers take the ids (rollout.tokenized adds the BOS). The ids
  are encoded when first asked for (`encode`), or all at once by `encode_all`; it pickles with them."""

  _ids: tuple[int, ...] | None
  _encode: Callable[[], list[int]] | None

  def __new__(cls, text: str, ids=None, encode=None) -> Rendered:
    out = super().__new__(cls, text)
    out._ids = None if ids is None else tuple(int(i) for i in ids)
    out._encode = encode  # () -> ids, where ids is None
    return out

  @property
  def ids(self) -> tuple[int, ...]:
    if self._ids is None:
      assert self._encode is not None
      self._ids = tuple(int(i) for i in self._encode())
      self._encode = None
    return self._ids

  def __reduce__(self):
    return (Rendered, (str(self), self.ids))


def rendered(tokenizer, render, value: Any) -> Rendered:
  """render(value) (a function of strings, or lists and dicts of them, to a prompt's text) as a
  Rendered whose ids hold `value`'s strings as data: rendered a second time from the protected value
  only when they spell a control token; otherwise the ids are the tokenizer's, exactly."""
  data = TextAsData(tokenizer)
  protected = data.protect(value)
  text = render(value)
  if data.held:
    return Rendered(text, encode=functools.partial(data.encode, render(protected)))
  return Rendered(text, encode=functools.partial(_plain, tokenizer, text))


def _plain(tokenizer, text: str) -> list[int]:
  return list(tokenizer(text, add_special_tokens=False).input_ids)


def encode_all(tokenizer, prompts) -> None:
  """Encodes the ids of the Rendered prompts among `prompts` whose text holds no control string, in one
  batched call of the tokenizer (the same ids as one at a time; a data set's lengths at load)."""
  plain = [
    p
    for p in prompts
    if isinstance(p, Rendered)
    and p._ids is None
    and isinstance(p._encode, functools.partial)
    and p._encode.func is _plain
  ]
  if plain:
    for p, ids in zip(plain, tokenizer([str(p) for p in plain], add_special_tokens=False).input_ids, strict=True):
      p._ids, p._encode = tuple(int(i) for i in ids), None


def prompt_ids(tokenizer, prompt: str) -> list[int]:
  """A prompt's ids without the tokenizer's added special tokens: a Rendered's own, else its text's
  as the tokenizer encodes it (control-token spellings as control tokens: text a template wrote)."""
  if isinstance(prompt, Rendered):
    return list(prompt.ids)
  return list(tokenizer(prompt, add_special_tokens=False).input_ids)
