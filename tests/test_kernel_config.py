"""`KernelConfig.from_dict`: an unknown field is refused, naming the fields it expects."""

from __future__ import annotations

import pytest

from nki_kernels.norm.config import RMSNormConfig


def test_an_unknown_field_names_the_expected_ones() -> None:
    good = RMSNormConfig().to_dict()
    assert RMSNormConfig.from_dict(good) == RMSNormConfig()
    with pytest.raises(ValueError) as err:
        RMSNormConfig.from_dict({**good, "rows_per_partiton": 2})
    msg = str(err.value)
    assert msg.startswith("RMSNormConfig: expected config fields among [")
    assert all(repr(name) in msg for name in good)
    assert msg.endswith("got unknown field(s) ['rows_per_partiton']")
