"""Imports go one way: every module of src/maxtext imports (at the top or inside a function) only
modules of its own layer or a lower one, and no chain of imports comes back to where it started.
The layers are the folders under src/maxtext, so no import runs up the folder tree."""

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

# Folders are the layers, lowest first: a module's layer is its top-level folder under src/maxtext
# (maxtext itself and maxtext.assets are utilities).
LAYERS = [
  ("utilities", ["utils"]),
  ("file formats", ["checkpoint_conversion"]),
  ("tasks and agents", ["tasks", "agents"]),
  ("config", ["configs"]),
  ("models and data", ["models", "input_pipeline"]),
  ("engines", ["inference"]),
  ("RL core", ["rl"]),
  ("Tunix boundary", ["integration"]),
  ("trainers", ["trainers"]),
]
TOP = len(LAYERS) - 1

# The few modules whose layer is not their folder's, and why.
EXCEPTIONS = {
  # The config's typed sections (and the table of MaxText's keys they are built from) are data every
  # layer receives, since a component gets the section it reads; they import only utilities. They stay
  # in configs, the config's folder.
  "maxtext.configs.sections": 0,
  "maxtext.configs.maxtext_keys": 0,
  # Entrypoints stay at their MaxText package paths; they sit on top and import any layer.
  "maxtext.inference.decode": TOP,
  "maxtext.inference.serve": TOP,
  "maxtext.checkpoint_conversion.to_huggingface": TOP,
  "maxtext.checkpoint_conversion.to_maxtext": TOP,
  "maxtext.trainers.post_train.rl.train_rl": TOP,
}


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in SRC.rglob("*.py"):
    name = ".".join(path.relative_to(SRC).with_suffix("").parts)
    out[name.removesuffix(".__init__")] = path
  return out


def _layer(module: str) -> int:
  """The layer of the module's top-level folder under src/maxtext (or its EXCEPTIONS entry)."""
  if module in EXCEPTIONS:
    return EXCEPTIONS[module]
  parts = module.split(".")
  if len(parts) == 1 or parts == ["maxtext", "assets"]:
    return 0
  matches = [i for i, (_, folders) in enumerate(LAYERS) if parts[1] in folders]
  assert matches, f"{module}: its folder {parts[1]} is in no layer of LAYERS; add it"
  return matches[0]


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


def test_every_exception_names_a_module():
  modules = _modules()
  assert [m for m in EXCEPTIONS if m not in modules] == []


def test_the_checks_see_an_upward_import():
  """The layer check would catch engines importing the Tunix boundary."""
  assert _layer("maxtext.inference.continuous_batching") < _layer("maxtext.integration.tunix.rollout")
  assert "maxtext.inference.continuous_batching" in _imports(_modules())["maxtext.integration.tunix.rollout"]


def _tunix_imports(module: str, path: pathlib.Path) -> list[str]:
  """The module's imports of Tunix (at the top or inside a function)."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [node.module]
    found += [f"{module} imports {n}" for n in names if n == "tunix" or n.startswith("tunix.")]
  return found


def test_only_integration_tunix_imports_tunix():
  """docs/architecture.md: only integration/tunix touches Tunix (imports at the top or inside a function)."""
  outside = [
    line
    for module, path in _modules().items()
    if not module.startswith("maxtext.integration.tunix")
    for line in _tunix_imports(module, path)
  ]
  assert not outside, "\n".join(outside)


def test_the_rl_core_is_free_of_tunix():
  """maxtext.rl, the RL step's own rules, imports no Tunix, directly or through the modules it imports."""
  modules, graph = _modules(), _imports(_modules())
  core = [m for m in modules if m == "maxtext.rl" or m.startswith("maxtext.rl.")]
  assert "maxtext.rl.dynamic_sampling" in core
  reached, todo = set(core), list(core)
  while todo:
    for target in graph[todo.pop()] - reached:
      reached.add(target)
      todo.append(target)
  found = [line for module in sorted(reached) for line in _tunix_imports(module, modules[module])]
  assert not found, "\n".join(found)
