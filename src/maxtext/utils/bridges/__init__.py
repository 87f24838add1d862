"""The scripts that play an environment in its own interpreter (environment.python) and take the run's
episodes over HTTP; the trainer imports them for their file paths and their standard-library helpers."""
