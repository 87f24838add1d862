"""The installed Tunix still has every member private_api.DEPENDENCIES names, with the parameters we
rely on, and our code touches no private Tunix member, and replaces no public one on an instance,
that the list does not name."""

import ast
import dataclasses
import importlib
import inspect
import pathlib
import re

import pytest

from maxtext.integration.tunix import private_api

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "maxtext"


def _owner(dep: private_api.PrivateDependency) -> type:
  module, name = dep.owner.rsplit(".", 1)
  return getattr(importlib.import_module(module), name)


def _tunix_sources(cls: type) -> str:
  return "".join(inspect.getsource(c) for c in cls.__mro__ if c.__module__.startswith("tunix"))


def _assigns(source: str, name: str) -> bool:
  """Whether `self.<name>` is assigned in the source (annotated or not)."""
  return re.search(rf"self\.{name}\s*(:[^=\n]*)?=(?!=)", source) is not None


@pytest.mark.parametrize("dep", private_api.DEPENDENCIES, ids=lambda d: f"{d.owner.rsplit('.', 1)[1]}.{d.name}")
def test_tunix_still_has_what_we_rely_on(dep):
  owner = _owner(dep)
  why = f"{dep.owner}.{dep.name} ({dep.use} in {dep.where}) changed in this Tunix; we rely on it because {dep.why}"
  if dep.params is None:
    assert _assigns(_tunix_sources(owner), dep.name), f"no longer set: {why}"
  else:
    assert callable(getattr(owner, dep.name, None)), f"no longer a method: {why}"
    params = tuple(inspect.signature(getattr(owner, dep.name)).parameters)
    assert params == dep.params, f"parameters now {params}, expected {dep.params}: {why}"


def _assigned_attributes(tree: ast.AST) -> list[ast.Attribute]:
  """Every `x.name` that is assigned to (also in tuple targets) under tree."""
  targets = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        targets += [t for t in ast.walk(target) if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)]
  return targets


def _private_names_used(tree: ast.AST, tunix_classes: dict[str, type]) -> dict[str, set[str]]:
  """Private names a module touches, by the Tunix class that defines them: members of its classes'
  Tunix bases (methods defined or called, self attributes), and attributes of other objects (by
  name, matched against every Tunix class this test knows)."""
  found: dict[str, set[str]] = {}
  private = lambda n: n.startswith("_") and not n.startswith("__")
  for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
    bases = [tunix_classes[b.attr] for b in cls.bases if isinstance(b, ast.Attribute) and b.attr in tunix_classes]
    for node in ast.walk(cls):
      name = node.name if isinstance(node, ast.FunctionDef) else node.attr if isinstance(node, ast.Attribute) else None
      if name and private(name):
        for base in bases:
          source = _tunix_sources(base)
          if callable(getattr(base, name, None)) or _assigns(source, name):
            found.setdefault(name, set()).add(base.__name__)
  for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:  # public base attributes rebound
    bases = [tunix_classes[b.attr] for b in cls.bases if isinstance(b, ast.Attribute) and b.attr in tunix_classes]
    for target in _assigned_attributes(cls):
      if isinstance(target.value, ast.Name) and target.value.id == "self" and not private(target.attr):
        for base in bases:
          if _assigns(_tunix_sources(base), target.attr) or callable(getattr(base, target.attr, None)):
            found.setdefault(target.attr, set()).add(base.__name__)
  # Fields of the Tunix dataclasses the module imports (agent_types.Step, Trajectory) are theirs to fill.
  fields = {f.name for c in tunix_classes.values() if dataclasses.is_dataclass(c) for f in dataclasses.fields(c)}
  for target in _assigned_attributes(tree):  # public members replaced on other objects (instances)
    if target.attr in fields:
      continue
    if not (isinstance(target.value, ast.Name) and target.value.id == "self") and not private(target.attr):
      for cls in tunix_classes.values():
        if callable(getattr(cls, target.attr, None)) or _assigns(_tunix_sources(cls), target.attr):
          found.setdefault(target.attr, set()).add(cls.__name__)
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and private(node.attr)
      and not (isinstance(node.value, ast.Name) and node.value.id == "self")
      and not (isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "super")
    ):
      for cls in tunix_classes.values():
        if callable(getattr(cls, node.attr, None)) or _assigns(_tunix_sources(cls), node.attr):
          found.setdefault(node.attr, set()).add(cls.__name__)
  return found


def test_no_private_tunix_member_is_used_without_an_entry():
  """Every module of ours that imports Tunix is scanned; a private member of a Tunix class it
  subclasses or reaches (RLCluster, the trainer) must be listed in private_api."""
  from tunix.rl import rl_cluster
  from tunix.sft import peft_trainer

  listed = {(d.owner.rsplit(".", 1)[1], d.name) for d in private_api.DEPENDENCIES}
  reached = {c.__name__: c for c in (rl_cluster.RLCluster, peft_trainer.PeftTrainer)}
  unlisted = {}
  for path in sorted(SRC.rglob("*.py")):
    text = path.read_text()
    if not re.search(r"^(from|import) tunix", text, re.M) or path.name == "private_api.py":
      continue
    module = importlib.import_module(".".join(path.relative_to(SRC.parent).with_suffix("").parts))
    tunix_classes = {**reached}
    for value in vars(module).values():  # the Tunix modules it imports, and their classes
      for cls in vars(value).values() if inspect.ismodule(value) and value.__name__.startswith("tunix") else []:
        if inspect.isclass(cls) and cls.__module__.startswith("tunix"):
          tunix_classes[cls.__name__] = cls
    for name, owners in _private_names_used(ast.parse(text), tunix_classes).items():
      if not any((owner, name) in listed for owner in owners) and not any(
        (base.__name__, name) in listed for owner in owners for base in tunix_classes[owner].__mro__
      ):
        unlisted.setdefault(path.name, set()).add(f"{'/'.join(sorted(owners))}.{name}")
  assert not unlisted, f"private Tunix members used but not listed in private_api.DEPENDENCIES: {unlisted}"


def test_shard_input_leaves_global_batches_as_they_are():
  """cluster.Cluster.update_actor relies on Tunix's shard_input returning arrays already laid out by
  mesh.global_batch (batch dimension over the data axes) untouched, instead of taking them for this
  process's share."""
  import jax
  import numpy as np
  from tunix.sft import sharding_utils

  from maxtext.utils import mesh as mesh_lib

  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), mesh_lib.MESH_AXES)
  placed = mesh_lib.global_batch({"ids": np.arange(12).reshape(4, 3)}, mesh)
  with mesh:  # shard_input reads the mesh of this context (Tunix's trainer sets it)
    out = sharding_utils.shard_input(placed, (mesh_lib.DATA_AXES,))
    local = sharding_utils.shard_input({"ids": np.arange(12).reshape(4, 3)}, (mesh_lib.DATA_AXES,))
  assert out["ids"] is placed["ids"]
  assert isinstance(local["ids"], jax.Array)  # a host array it does place (so the mesh was seen)
