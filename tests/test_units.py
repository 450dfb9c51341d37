import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npusim.spec import units


@pytest.mark.parametrize("text,dim,expected", [
    ("1.6 TB/s", "bandwidth", 1.6e12),
    ("192 KiB", "bytes", 192 * 1024),
    ("64 GB", "bytes", 64e9),
    ("64 GiB", "bytes", 64 * 2**30),
    ("1.85 GHz", "frequency", 1.85e9),
    ("400 Gb/s", "bandwidth", 50e9),
    ("10 us", "time", 10e-6),
    ("10 µs", "time", 10e-6),
    ("350 W", "power", 350.0),
    ("8 MUSD", "money", 8e6),
    (4096, "number", 4096.0),
])
def test_parse_known_quantities(text, dim, expected):
    assert math.isclose(units.parse(text, dim), expected, rel_tol=1e-12)


def test_si_and_binary_prefixes_are_different_numbers():
    assert units.parse("1 MiB", "bytes") / units.parse("1 MB", "bytes") == pytest.approx(1.048576)


@pytest.mark.parametrize("text,dim", [("1.6 TB", "bandwidth"), ("fast", "bandwidth"), ("12 GHz/s", "frequency"),
                                      ("3 parsecs", "time"), (True, "bytes")])
def test_bad_units_are_refused(text, dim):
    with pytest.raises(units.UnitError):
        units.parse(text, dim)


@given(st.sampled_from(sorted(units.DIMENSIONS)),
       st.floats(min_value=1e-9, max_value=1e18, allow_nan=False, allow_infinity=False))
def test_format_parse_round_trip(dim, value):
    text = units.format(value, dim, digits=12)
    assert math.isclose(units.parse(text, dim), value, rel_tol=1e-10)


@given(st.sampled_from(sorted(units.DIMENSIONS["bandwidth"].units)), st.floats(min_value=0.001, max_value=1e6))
def test_every_accepted_unit_parses_back(unit, mantissa):
    text = f"{mantissa!r} {unit}" if unit else repr(mantissa)
    assert math.isclose(units.parse(text, "bandwidth"), mantissa * units.DIMENSIONS["bandwidth"].units[unit],
                        rel_tol=1e-12)
