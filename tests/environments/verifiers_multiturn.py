"""A verifiers MultiTurnEnv written with verifiers 0.1.14's own API, with its own env_response: a
guessing game of `turns` replies at most; each wrong reply is answered with a hint, and the rollout
ends when the reply holds the word (a @vf.stop condition). The rubric rewards the hit."""

import verifiers as vf
from datasets import Dataset


class GuessEnv(vf.MultiTurnEnv):
  async def env_response(self, messages, state, **kwargs):
    return [{"role": "user", "content": f"No. Try again: say {state['answer']}."}]

  @vf.stop
  async def guessed(self, state, **kwargs) -> bool:
    steps = state["trajectory"]  # one step per model call: its prompt and completion messages
    return bool(steps) and state["answer"] in str(steps[-1]["completion"][-1].get("content") or "")


def load_environment(turns: int = 2) -> vf.Environment:
  dataset = Dataset.from_list([{"question": f"Say the word {w}.", "answer": w} for w in ("river", "stone")])

  def hit(completion, answer, **kwargs) -> float:
    return float(any(answer in str(m.get("content") or "") for m in completion if m["role"] == "assistant"))

  return GuessEnv(dataset=dataset, max_turns=turns, rubric=vf.Rubric(funcs=[hit]))
