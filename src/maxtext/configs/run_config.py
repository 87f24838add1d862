"""The whole run config: the typed sections every component receives one of, and the one check of
all the config's rules (`RunConfig.check`).

User code written for MaxText (reward functions, dataset processors) keeps its `tmvp_config`: the
flat attribute view `RunConfig.maxtext_view()`, which RunConfig itself answers too (cfg.reasoning_start_token,
cfg.rl.num_generations), for MaxText code that holds what pyconfig.initialize returns.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from maxtext.configs import checks, maxtext_keys, sections
from maxtext.configs.sections import (
  SECTION_TYPES,
  AgenticSection,
  AgentSection,
  AlgorithmSection,
  CriticSection,
  DataSection,
  EnvironmentSection,
  EvalSection,
  MeshSection,
  ModelSection,
  RewardModelSection,
  RewardTrainingSection,
  RunSection,
  SamplingSection,
  ServeSection,
  TaskSection,
  ToolsSection,
  TrainSection,
)
from maxtext.utils import distributed


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The whole run config: only entrypoints and the configs package hold it; components get sections.

  overridden: dotted key -> (value, where it was set) for every key that differs from base.yml;
  urls: dotted key -> the bucket URL of an input replaced by a local copy (config.yml records the URL);
  maxtext_only: dotted key -> value of the MaxText keys that maxtext_compat=true accepted unused
  (config.yml records them).
  """

  run: RunSection
  model: ModelSection
  mesh: MeshSection
  data: DataSection
  task: TaskSection
  train: TrainSection
  sampling: SamplingSection
  serve: ServeSection
  eval: EvalSection
  algorithm: AlgorithmSection
  critic: CriticSection
  reward_model: RewardModelSection
  reward_training: RewardTrainingSection
  agentic: AgenticSection
  agent: AgentSection
  environment: EnvironmentSection
  tools: ToolsSection
  overridden: Mapping[str, tuple[Any, str]] = dataclasses.field(default_factory=dict)
  urls: Mapping[str, str] = dataclasses.field(default_factory=dict)
  maxtext_only: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_values(
    cls,
    values: Mapping[str, Any],
    overridden: Mapping[str, tuple[Any, str]] | None = None,
    urls=None,
    maxtext_only: Mapping[str, Any] | None = None,
  ) -> RunConfig:
    """Sections from dotted key -> value (every base.yml key, each claimed by exactly one field)."""
    built: dict[str, Any] = {}
    claimed: set[str] = set()
    for name, section in SECTION_TYPES.items():
      keys = sections.yaml_keys(section)
      built[name] = section(**{field: sections.frozen(values[key]) for field, key in keys.items()})
      claimed.update(keys.values())
    unclaimed = sorted(set(values) - claimed)
    if unclaimed:
      raise AssertionError(f"base.yml keys in no section of RunConfig: {unclaimed}")
    return cls(**built, overridden=dict(overridden or {}), urls=dict(urls or {}), maxtext_only=dict(maxtext_only or {}))

  def flat(self) -> dict[str, Any]:
    """Dotted base.yml key -> value (lists and mappings as YAML writes them)."""
    out = {}
    for name, section in SECTION_TYPES.items():
      part = getattr(self, name)
      out.update({key: sections.thawed(getattr(part, field)) for field, key in sections.yaml_keys(section).items()})
    return out

  def public(self) -> dict[str, Any]:
    """flat(), each secret key that is set (sections.SECRET_KEYS: API keys) written as
    sections.SECRET_WRITTEN: what config.yml and W&B record."""
    flat = self.flat()
    return {k: sections.SECRET_WRITTEN if k in sections.SECRET_KEYS and v else v for k, v in flat.items()}

  def replace_values(self, changes: Mapping[str, Any], urls: Mapping[str, str]) -> RunConfig:
    """This config with some dotted keys set to other values and their URLs recorded."""
    return RunConfig.from_values({**self.flat(), **changes}, self.overridden, {**self.urls, **urls}, self.maxtext_only)

  def check(self, job: distributed.Job | None = None, program: str | None = None) -> RunConfig:
    """This config, if it keeps every rule of the config; else a ConfigError naming the key(s), the
    value(s) and what was expected: each key's own rules (sections.key: choices, bounds, paths) and
    the rules that relate keys (checks.check); with `job` (the processes and devices the run has,
    distributed.initialize's answer) also the rules of the layout on them (checks.check_job); with
    `program` (an entrypoint's name) also what that program needs (checks.PROGRAM_RULES)."""
    flat = self.flat()
    checks.check(flat)
    if program is not None:
      checks.check_program(flat, program)
    if job is not None:
      checks.check_job(flat, self.mesh, job)
    return self

  def maxtext_view(self) -> sections.MaxTextView:
    """The flat view MaxText-format user code receives as tmvp_config: every key, under MaxText's
    names of renamed ones too, and the MaxText keys maxtext_compat accepted."""
    flat = self.flat()
    renamed = {theirs: flat[ours] for theirs, ours in maxtext_keys.RENAMED.items()}
    tree = sections.unflatten({**flat, **renamed, **self.maxtext_only})
    tree.update({k: v for k, v in tree["rl"].items() if k not in tree})  # the rl keys' flat spelling too
    return sections.MaxTextView(tree)

  if not typing.TYPE_CHECKING:  # our own code reads the typed sections, and mypy holds it to them

    def __getattr__(self, name: str) -> Any:
      """MaxText's flat attribute names, read-only: cfg.reasoning_start_token, cfg.rl.num_generations."""
      if name.startswith("_"):
        raise AttributeError(name)
      return getattr(self.maxtext_view(), name)
