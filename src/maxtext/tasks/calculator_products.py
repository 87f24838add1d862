"""Products a small model cannot compute itself, with a calculator: "What is a * b?" for a four-digit a
and a two-digit b (40 questions, seeded, no splits of their own). Rewarded reward_exact_answer when
the number the reply ends with, after its last tool call, is the product. The shipped template
demonstrates two calculator calls, each with its result and the answer: agentic runs with
rl.tools=[calculator] learn to call it."""

from __future__ import annotations

import random

from maxtext.configs.sections import TaskSection
from maxtext.tasks.task import RewardFn, Task, Verdict
from maxtext.utils import numbers

_TOOL_CALL_END = "</tool_call>"


def _final_number(reply: str) -> str | None:
  """The last number after the reply's last tool call (a call's arguments are not the answer)."""
  found = numbers.last_number_text(reply.split(_TOOL_CALL_END)[-1])
  return None if found is None else found.replace(",", "")


def exact_product(prompts, completions, tmvp_config, answer, **kwargs) -> list[float]:
  """reward_exact_answer when the reply's final number is the product, else 0."""
  return [tmvp_config.reward_exact_answer * float(_final_number(c) == str(a)) for c, a in zip(completions, answer)]


def _rewards(task: TaskSection) -> tuple[RewardFn, ...]:
  return (exact_product,)


def _score(completions: list[str], truths: list[str], task: TaskSection) -> list[Verdict]:
  out = []
  for c, truth in zip(completions, truths):
    guess = _final_number(c)
    ok = guess == str(truth)
    value = numbers.parse_number(guess) if guess else None
    near = numbers.within(value, numbers.parse_number(str(truth)), 0.1)
    out.append({"answer": guess, "correct": ok, "partially_correct": ok or near, "formatted": guess is not None})
  return out


def _rows() -> list[dict]:
  rng = random.Random(0)
  pairs = [(rng.randint(1000, 9999), rng.randint(11, 99)) for _ in range(40)]
  return [{"question": f"What is {a} * {b}?", "answer": str(a * b)} for a, b in pairs]


TASK = Task(
  name="calculator_products",
  template="calculator_products.json",
  rewards=_rewards,
  score=_score,
  all_rows=_rows,
  reads=("reward_exact_answer",),
)
