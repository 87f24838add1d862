"""A verifiers v1 environment written with verifiers.v1's own API: a Taskset of rows from a source
function, a reward declared with @vf.reward, composed by vf.Env with the default Harness."""

import verifiers.v1 as vf


def source():
  for i in range(4):
    yield {
      "example_id": i,
      "prompt": [{"role": "user", "content": f"Reply with the word blue ({i})."}],
      "answer": "blue",
    }


@vf.reward(weight=1.0)
async def says_answer(task, state) -> float:
  return float(task["answer"] in str(state.get("completion") or ""))


def load_environment(config: vf.EnvConfig | None = None):
  config = config or vf.EnvConfig()
  return vf.Env(taskset=vf.Taskset(source=source, rewards=[says_answer], config=config.taskset))
