"""shutdown.GracefulStop: the first SIGINT is a stop request that records the run's progress then (what
tells a second signal in the step in flight from one while the run stops after it), the second a
KeyboardInterrupt; on leaving, the previous handlers are back."""

import os
import signal

import pytest

from maxtext.utils import shutdown


def test_the_first_signal_records_the_progress_and_the_second_interrupts():
  steps = [1]
  previous = signal.getsignal(signal.SIGINT)
  stop = shutdown.GracefulStop()
  stop.progress = lambda: steps[0]
  with stop:
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.signum == signal.SIGINT and stop.first_at == 1 and stop.second is None
    steps[0] = 2  # the step in flight at the first signal ended
    with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
      os.kill(os.getpid(), signal.SIGINT)
    assert stop.second == signal.SIGINT and stop.first_at == 1
  assert signal.getsignal(signal.SIGINT) is previous
