"""Imports go one way: every module of src/maxtext imports (at the top or inside a function) only
modules of its own layer or a lower one, and no chain of imports comes back to where it started."""

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

# Lowest first. A module belongs to the layer of the longest prefix matching its name.
LAYERS = [
  (
    "utilities",
    ["maxtext.utils", "maxtext.assets", "maxtext", "maxtext.configs.sections", "maxtext.configs.maxtext_keys"],
  ),
  (
    "file formats",
    [
      "maxtext.checkpoint_conversion.gguf_reader",
      "maxtext.checkpoint_conversion.hf_checkpoint",
      "maxtext.checkpoint_conversion.hf_config",
      "maxtext.checkpoint_conversion.orbax_checkpoint",
    ],
  ),
  # Tasks sit below the config, which refuses a reward key the run's task never reads; binding their
  # rewards to a template (tasks.rewards) is with the data.
  ("tasks", ["maxtext.tasks"]),
  ("config", ["maxtext.configs"]),
  ("models and data", ["maxtext.models", "maxtext.input_pipeline", "maxtext.tasks.rewards"]),
  ("engines", ["maxtext.inference.continuous_batching"]),
  (
    "Tunix boundary and RL pieces",
    [
      "maxtext.integration",
      "maxtext.trainers.post_train.rl.tools",
      "maxtext.trainers.post_train.rl.tool_worker",
      "maxtext.trainers.post_train.rl.sandbox",
      "maxtext.trainers.post_train.rl.run_folder",
      "maxtext.trainers.post_train.rl.utils_rl",
    ],
  ),
  (
    "entrypoints",
    [
      "maxtext.inference.decode",
      "maxtext.checkpoint_conversion.to_huggingface",
      "maxtext.checkpoint_conversion.to_maxtext",
      "maxtext.trainers.post_train.rl.train_rl",
      "maxtext.trainers.post_train.rl.training_run",
      "maxtext.trainers.post_train.rl.evaluate_rl",
      "maxtext.trainers.post_train.rl.report",
      "maxtext.trainers.post_train.rl.footprint",
    ],
  ),
]


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in SRC.rglob("*.py"):
    name = ".".join(path.relative_to(SRC).with_suffix("").parts)
    out[name.removesuffix(".__init__")] = path
  return out


def _layer(module: str) -> int:
  """The layer of the longest prefix in LAYERS matching the module."""
  matches = [
    (len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes if module == p or module.startswith(p + ".")
  ]
  assert matches, f"{module} is in no layer of LAYERS; add it"
  return max(matches)[1]


def _imports(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
  """module -> the modules of src/maxtext it imports anywhere in its file (`from pkg import mod`
  names mod; `from mod import name` names mod)."""
  graph = {}
  for module, path in modules.items():
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        targets.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets.update(
          f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
        )
    graph[module] = {t for t in targets if t in modules and t != module}
  return graph


def test_every_import_goes_to_the_same_layer_or_below():
  modules = _modules()
  upward = [
    f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
    for m, targets in _imports(modules).items()
    for t in sorted(targets)
    if _layer(t) > _layer(m)
  ]
  assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_no_import_cycle():
  graph = _imports(_modules())
  state: dict[str, int] = {}  # 1: on the current path, 2: done

  def visit(module, path):
    state[module] = 1
    for target in sorted(graph[module]):
      if state.get(target) == 1:
        raise AssertionError("import cycle: " + " -> ".join(path[path.index(target) :] + [target]))
      if target not in state:
        visit(target, path + [target])
    state[module] = 2

  for module in sorted(graph):
    if module not in state:
      visit(module, [module])


def test_the_checks_see_an_upward_import():
  """The layer check would catch engines importing the Tunix boundary."""
  assert _layer("maxtext.inference.continuous_batching") < _layer("maxtext.integration.tunix.rollout")
  assert "maxtext.inference.continuous_batching" in _imports(_modules())["maxtext.integration.tunix.rollout"]
