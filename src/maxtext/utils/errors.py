"""The errors a user can fix: a config key, input file or data that is not what the program expects.

Their message names the key or file and what was expected; command-line programs print it as one
line and exit 2. Any other exception is ours (or a library's) and keeps its traceback.
"""


class InputError(ValueError):
  """An input the config names (a file, folder, user code or its data) is not what the program
  expects; ConfigError where the config's values alone break a rule."""


class MissingInputError(InputError, FileNotFoundError):
  """A file or folder the config names does not exist (or lacks what it must hold)."""


class ConfigError(InputError):
  """The config's values break a rule, known without reading any input: raised where the config is
  read and checked (the configs package, against the job's devices and what the program needs too)
  and where a rerun meets its run folder (a resumed run's settings and checkpoint layout)."""

  @classmethod
  def of(cls, problems: list[str]) -> "ConfigError":
    """One error for all of a config's problems: the problem itself where there is one, else a
    count and one problem per line."""
    if len(problems) == 1:
      return cls(problems[0])
    return cls(f"{len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems))
