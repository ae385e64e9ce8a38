"""Uncertainty bands: the sets they span, their order, and the printed form."""

from __future__ import annotations

import pytest

from nki_kernels.interp import TensorSpec
from nki_kernels.perfmodel import trace_kernel
from nki_kernels.perfmodel.anchor_fit import load_fit
from nki_kernels.perfmodel.band import (
    band,
    band_estimate,
    format_band,
    format_latency,
    parameter_sets,
    structural_pct,
    widen,
)
from nki_kernels.perfmodel.calibration import matmul_fully_blocked, matmul_tiled
from nki_kernels.perfmodel.estimate import roofline_ns
from nki_kernels.perfmodel.timeline import schedule
from nki_kernels.targets import get_target

SPECS = (TensorSpec((1024, 2048), "bfloat16"), TensorSpec((1024, 1024), "bfloat16"))


def test_sets_are_the_shipped_set_the_loo_fits_and_two_corners():
    rec = load_fit()["targets"]["trn2"]
    sets = parameter_sets("trn2")
    assert sets[0] is get_target("trn2")
    kept = [k for k in rec["loo_sets"] if k not in rec["loo_dropped"]]
    assert len(sets) == 1 + len(kept) + 2
    corners = sets[-2:]
    for name, (lo, hi, _doc, _src, sign) in rec["unanchored"].items():
        slow, fast = (hi, lo) if sign > 0 else (lo, hi)
        assert getattr(corners[0], name) == slow and getattr(corners[1], name) == fast


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_band_contains_the_modeled_latency(target):
    trace = trace_kernel(matmul_tiled, *SPECS, target=target)
    lo, hi = band(trace, target)
    central = schedule(trace, target).latency_ns
    assert lo <= central <= hi
    # the structural term: at least the cross-validated error on each side (the low end
    # no lower than the roofline)
    f = 1 + structural_pct(target) / 100
    floor = roofline_ns(trace, get_target(target))
    assert lo <= max(central / f, floor) * (1 + 1e-12) and hi >= central * f * (1 - 1e-12)
    assert lo >= floor
    if len(parameter_sets(target)) > 1:  # trn1's leave-one-out sets may still be pending
        assert hi > lo


def test_mfu_band_is_the_latency_band_inverted():
    trace = trace_kernel(matmul_fully_blocked, *SPECS, target="trn2")
    b = band_estimate(trace, "trn2")
    assert b.mfu_lo <= b.mfu <= b.mfu_hi
    assert b.mfu_lo * b.latency_hi_ns == pytest.approx(b.mfu * b.latency_ns)
    assert b.mfu_text().endswith("%)")


def test_band_low_end_stops_at_the_roofline_so_mfu_ends_at_100_pct(monkeypatch):
    # a structural error large enough that the widened low end would pass the time
    # TensorE needs at its peak: the band stops at the roofline (a band end above
    # 100 % MFU is a latency no hardware reaches)
    import nki_kernels.perfmodel.band as band_mod

    trace = trace_kernel(matmul_fully_blocked, *SPECS, target="trn2")
    tgt = get_target("trn2")
    floor = roofline_ns(trace, tgt)
    monkeypatch.setattr(band_mod, "structural_pct", lambda target=None: 400.0)
    lo, hi = band(trace, tgt)
    assert lo == floor and hi > schedule(trace, tgt).latency_ns * 4
    b = band_estimate(trace, tgt)
    assert b.mfu_hi <= 1.0 + 1e-12 and b.mfu_lo < b.mfu < b.mfu_hi


def test_formats():
    assert format_band(63.1, 51.0, 70.2, "%") == "63 % (51–70 %)"
    assert format_latency(2.1e6, 1.9e6, 2.6e6) == "2.10 ms (1.90–2.60 ms)"
    assert format_latency(97.0, 90.0, 110.0) == "97 ns (90–110 ns)"


def test_loo_sets_that_miss_their_own_anchor_by_over_25_pct_are_dropped():
    # v3: a leave-one-out set is a plausible parameter set only if it predicts the anchor
    # it was fitted without to within 25 % (trn1: the perf guide's chain, -30 %)
    rec = load_fit()["targets"]["trn1"]
    assert rec["loo_dropped"] == ["perf_guide.dependent_activations"]
    kept = [p for k, p in rec["loo_sets"].items() if k not in rec["loo_dropped"]]
    sets = parameter_sets("trn1")
    assert len(sets) == 1 + len(kept) + (2 if rec["unanchored"] else 0)
    for t, params in zip(sets[1:], kept, strict=False):
        assert all(getattr(t, k) == v for k, v in params.items())
    for aid in rec["loo_dropped"]:
        assert abs(rec["anchors"][aid]["loo_error_pct"]) > 25


def test_structural_term_is_the_rms_of_the_loo_errors_and_trn3_takes_trn2s():
    import math

    # the leave-one-out errors of the fitted anchors and the errors of the held-out ones
    rec = load_fit()["targets"]["trn2"]
    loo = [v["loo_error_pct"] for v in rec["anchors"].values() if v["fitted"]]
    held = [v["error_pct"] for v in rec["anchors"].values() if v.get("held_out")]
    assert len(held) >= 6
    errs = loo + held
    rms = math.sqrt(sum(math.log1p(x / 100) ** 2 for x in errs) / len(errs))
    assert structural_pct("trn2") == pytest.approx(100 * (math.exp(rms) - 1))
    assert structural_pct("trn3") == structural_pct("trn2") > 0
    lo, hi = widen(100.0, 100.0, "trn2", terms=2)
    f = 1 + structural_pct("trn2") / 100 * math.sqrt(2)
    assert (lo, hi) == pytest.approx((100 / f, 100 * f))
