"""The errors a user can fix: a config key, input file or data that is not what the program expects.

Their message names the key or file and what was expected; command-line programs print it as one
line and exit 2. Any other exception is ours (or a library's) and keeps its traceback.
"""


class InputError(ValueError):
  """A config value, input file or its data is not what the program expects."""


class MissingInputError(InputError, FileNotFoundError):
  """A file or folder the config names does not exist (or lacks what it must hold)."""


class ConfigError(InputError):
  """A config key, value or file is not what the program expects."""
