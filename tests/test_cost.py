"""Cost: $ per million tokens and J per token follow the system's price and power and the named parameters."""

from types import SimpleNamespace

import pytest

from npusim.errors import NpusimError
from npusim.results.cost import SECONDS_PER_YEAR, CostParams, chip_usd_per_second, cost


def _pred(**over):
    return SimpleNamespace(system="cloudmatrix384", overrides=over, tokens_per_s_per_chip=100.0,
                           prefill_tokens_per_s_per_chip=5000.0)


def test_cost_is_chip_time_over_tokens():
    params = CostParams()
    c = cost(_pred(), params)
    assert c.decode_usd_per_mtok * 100.0 / 1e6 == pytest.approx(c.usd_per_chip_hour / 3600)
    assert c.prefill_usd_per_mtok == pytest.approx(c.decode_usd_per_mtok * 100 / 5000)
    assert c.decode_system_joules_per_token == pytest.approx(1460 * params.pue / 100.0)  # A3: 1.46 kW all-in


def test_price_power_and_parameters_move_cost_the_right_way():
    base = cost(_pred())
    assert cost(_pred(price_per_chip="42000USD")).decode_usd_per_mtok > base.decode_usd_per_mtok
    assert cost(_pred(power_per_chip="3000W")).decode_system_joules_per_token > base.decode_system_joules_per_token
    assert cost(_pred(), CostParams(utilisation=0.3)).decode_usd_per_mtok == pytest.approx(
        2 * base.decode_usd_per_mtok)
    assert cost(_pred(), CostParams(amortisation_years=8)).decode_usd_per_mtok < base.decode_usd_per_mtok


def test_chip_cost_per_second():
    p = CostParams(amortisation_years=1, usd_per_kwh=0.0001, pue=1)
    assert chip_usd_per_second(0.0, SECONDS_PER_YEAR, p) == pytest.approx(1.0)
    assert chip_usd_per_second(3.6e6 / 0.0001, 0.0, p) == pytest.approx(1.0)  # W such that 1 $/s


@pytest.mark.parametrize("field, value", [("utilisation", 1.5), ("utilisation", 0), ("pue", -1)])
def test_bad_parameters(field, value):
    with pytest.raises(NpusimError, match=field):
        CostParams(**{field: value})
