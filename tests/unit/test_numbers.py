"""Numbers in answers, by hand."""

from maxtext.utils import numbers


def test_numbers_as_written_and_parsed():
  assert numbers.last_number_text("3 + 5 = 8") == "8"
  assert numbers.last_number_text("It costs $1,250.50 in all") == "1,250.50"
  assert numbers.first_number_text("9 (apples), 4 pears") == "9"
  assert numbers.last_number_text("no number") is None
  assert numbers.parse_number("from -3 to -.5") == -0.5
  assert numbers.parse_number("1,000,000 ants") == 1e6


def test_within_a_relative_tolerance():
  assert numbers.within(9.0, 10.0, 0.1) and numbers.within(11.0, 10.0, 0.1)
  assert not numbers.within(8.9, 10.0, 0.1) and numbers.within(8.9, 10.0, 0.2)
  assert not numbers.within(None, 10.0, 0.1) and not numbers.within(0.0, 0.0, 0.1)
