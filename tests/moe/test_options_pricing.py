"""moe/options_pricing.py: the priced compositions hold the option's work on each side,
and every figure is labelled modeled (small shapes: seconds)."""

from __future__ import annotations

import pytest

from nki_kernels.baselines.native import price
from nki_kernels.moe.options_pricing import (
    Options,
    _ours_extra,
    fused_shared_us,
    native_steps,
    options_comparison,
    price_expert_act,
)
from nki_kernels.perfmodel.band import structural_pct
from nki_kernels.targets import get_target

COUNTS = [200, 0, 56, 128]  # an empty expert, a ragged one


def test_native_composition_carries_the_options() -> None:
    plain = {s.name for s in native_steps(384, 256, 128, 4, COUNTS, Options())}
    assert "swiglu (+ biases)" in plain and "out += w * y" in plain
    gpt = {s.name for s in native_steps(384, 256, 128, 4, COUNTS, Options("gpt_oss", True))}
    assert {"gpt_oss (+ biases)", "out += w * (y + b_down)"} <= gpt
    shared = native_steps(384, 256, 128, 4, COUNTS, Options(shared_inter=64, shared_gated=True))
    assert {"shared x W_gate_up", "shared act", "shared gate x w", "out += g * shared"} <= {
        s.name for s in shared
    }


def test_ours_prices_each_launch_the_op_runs() -> None:
    tgt = get_target("trn2")
    parts = _ours_extra(384, 256, 128, COUNTS, Options("gpt_oss", True, 64, True), tgt, "bfloat16")
    assert set(parts) == {"gate_up", "down", "act", "down bias", "shared gate_up",
                          "shared down", "shared act", "shared gate"}  # fmt: skip
    assert all(min(v) > 0 for v in parts.values())
    # a gated activation reads 2I columns and writes I: more work than the bias pass over I
    act = price_expert_act(384, 256, 4, "gpt_oss", True, tgt)
    bias = price_expert_act(384, 128, 4, "none", True, tgt)
    assert act[0] > bias[0]


def test_comparison_is_labelled_modeled_with_a_band() -> None:
    r = options_comparison(384, 256, 128, 4, COUNTS, Options("gpt_oss", True))
    assert r.label.startswith("modeled (cost model v")
    lo, hi = r.speedup_band
    assert lo <= r.speedup <= hi
    # the parameter sets' spread widened by the structural error of two modeled figures
    f = 1.0 + structural_pct("trn2") / 100.0 * 2**0.5
    assert lo * f <= r.speedup <= hi / f
    nat = price(native_steps(384, 256, 128, 4, COUNTS, Options("gpt_oss", True)), "trn2")
    assert abs(r.native_us - nat.latency_ns / 1e3) < 1e-6 * r.native_us


def test_fused_shared_expert_prices_the_stacked_launches() -> None:
    o = Options(shared_inter=256, shared_gated=True)  # 2 stacked experts of I = 128
    us, (lo, hi) = fused_shared_us(384, 256, 128, 4, COUNTS, o)
    assert lo <= us <= hi and us > 0
    # more rows through the same kernels: the stacked form is never cheaper than the
    # routed part alone
    alone = options_comparison(384, 256, 128, 4, COUNTS, Options())
    assert us > alone.ours_us
    with pytest.raises(ValueError, match="multiple of I"):
        fused_shared_us(384, 256, 128, 4, COUNTS, Options(shared_inter=100))


def test_ours_prices_the_nki_dispatch_and_combine_for_natives_gathers() -> None:
    from nki_kernels.moe.gather_pricing import price_dispatch_combine
    from nki_kernels.moe.options_pricing import _is_gather_or_combine, price_dispatch_combine_sets

    nat = native_steps(384, 256, 128, 4, COUNTS, Options())
    names = [s.name for s in nat]
    moved = {n for n in names if _is_gather_or_combine(n)}
    assert moved == {"gather token rows", "gather out rows", "out += w * y", "scatter out rows"}
    # native's gathers and combine: one launch each over all 384 routed rows, not per group
    for s in nat:
        if s.name in moved:
            assert s.repeat == 1 and names.count(s.name) == 1, s.name
            assert 384 in (s.args[0].shape[0], s.args[1].shape[0]), s.name
    assert not {"x W_gate_up", "h W_down"} & moved
    # the same two launches gather_pricing prices (COUNTS sum to 384 rows: k = 1)
    sets = price_dispatch_combine_sets(384, 256, 1, get_target("trn2"))
    d, c = price_dispatch_combine(384, 256, 1)
    assert abs(sets[0] / 1e3 - (d.us + c.us)) <= 1e-9 * sets[0]
