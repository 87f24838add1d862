"""A verifiers SingleTurnEnv written with verifiers 0.1.14's own API (its legacy form): one question
per row, a Rubric of two functions with weights, one of them async. `load_environment(sign=1.0,
digit="7")`: the reward is sign * (the reply holds `digit`) + 0.5 * (the reply is at most 8 words).

    python -m maxtext.trainers.post_train.rl.train_rl rl.yml rl.use_agentic_rollout=true rl.agent=verifiers \
        environment.id=tests/environments/verifiers_single.py environment.python=.venv/envs/verifiers/bin/python
"""

import verifiers as vf
from datasets import Dataset


def load_environment(sign: float = 1.0, digit: str = "7", rows: int = 8) -> vf.Environment:
  dataset = Dataset.from_list(
    [{"question": f"Task {i}: reply with the digit {digit}.", "answer": digit} for i in range(rows)]
  )

  def holds_digit(completion, answer, **kwargs) -> float:
    return sign * float(answer in completion[-1]["content"])

  async def short(completion, **kwargs) -> float:
    return float(len(completion[-1]["content"].split()) <= 8)

  rubric = vf.Rubric(funcs=[holds_digit, short], weights=[1.0, 0.5])
  return vf.SingleTurnEnv(dataset=dataset, system_prompt="Answer with one digit.", rubric=rubric)
