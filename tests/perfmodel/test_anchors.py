"""Cost model v3 against the published anchors (the cheap ones; the tutorial matmuls and
the Mamba kernels are priced in benchmarks/bench_calibration.py)."""

from __future__ import annotations

import pytest

from nki_kernels.perfmodel.anchor_fit import choose_window, load_fit
from nki_kernels.perfmodel.anchors import AnchorSet, ext_dir, load_anchors
from nki_kernels.perfmodel.fit import FIT_PARAMETERS, SCHEDULING_WINDOWS
from nki_kernels.targets import SHIPPED_TARGETS, get_target

CHEAP = ("dma_overview.", "perf_guide.")


def test_every_anchor_names_its_source_and_what_was_measured():
    anchors = load_anchors()
    assert len(anchors) >= 15
    for a in anchors:
        assert a.source["repo"] and len(a.source["commit"]) == 40 and a.source["path"]
        assert a.target in SHIPPED_TARGETS and a.measured_ns > 0
        assert a.priced_by in ("aws-kernel", "faithful-reimplementation")
        if a.priced_by == "aws-kernel":
            assert a.kernel_source and a.kernel_source["function"]


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_cheap_anchors_within_15_percent(target):
    cheap = [a for a in load_anchors() if a.target == target and a.id.startswith(CHEAP)]
    aset = AnchorSet.build(target, cheap)
    assert not aset.unavailable
    for aid, value in aset.price(get_target(target)).items():
        measured = next(a.measured_ns for a in cheap if a.id == aid)
        assert abs(value / measured - 1) <= 0.15, (aid, value, measured)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_shipped_parameters_are_the_stored_fit(target):
    rec = load_fit()["targets"][target]
    tgt = SHIPPED_TARGETS[target]
    for name, lo, hi, _doc, _src in FIT_PARAMETERS[target]:
        value = rec["params"][name]
        assert lo <= value <= hi
        assert getattr(tgt, name) == pytest.approx(value, rel=0.005), name
    for aid, row in rec["anchors"].items():
        # the record also lists the priced-but-not-fitted anchors (fused Mamba), each
        # with its error and the reason in anchors.json; the fit's own are within 15 %
        if row["fitted"]:
            assert abs(row["error_pct"]) <= 15, aid
        else:
            assert next(a for a in load_anchors() if a.id == aid).not_fitted_because
    window = rec.get("scheduling_window")
    if target in SCHEDULING_WINDOWS:
        assert window["chosen"] == tgt.scheduling_window
        costs = window["grid_cost"]
        assert str(window["chosen"]) == min(costs, key=costs.__getitem__)
    else:
        assert window is None and tgt.scheduling_window == 1


class _StubAnchors:
    """Residuals that depend only on the scheduling window: best at window 4."""

    fitted_ids = ("a", "b")

    def log_errors(self, target, ids=None):
        err = 0.1 * abs(target.scheduling_window - 4)
        return {"a": err, "b": -err / 2}


def test_choose_window_takes_the_least_squared_error_window():
    w, costs = choose_window(_StubAnchors(), get_target("trn1"), (1, 2, 4, 8))
    assert w == 4
    assert set(costs) == {1, 2, 4, 8}
    assert costs[4] == 0.0 and costs[1] == pytest.approx(0.09 + 0.0225)


def test_an_absent_checkout_makes_an_anchor_unavailable_not_replaced(monkeypatch, tmp_path):
    monkeypatch.setenv("NKI_KERNELS_EXT_DIR", str(tmp_path))
    rows = [a for a in load_anchors() if a.id == "matmul_tutorial.tiled"]
    aset = AnchorSet.build("trn1", rows)
    assert not aset.anchors
    assert "FileNotFoundError" in aset.unavailable["matmul_tutorial.tiled"]


NKI_AUTOTUNE = "awslabs+nki-autotune/kernel_library/matmul/lhs_rhs/kernel_handtuned_89.26mfu.py"


@pytest.mark.skipif(
    not (ext_dir() / NKI_AUTOTUNE).is_file(),
    reason="no nki-autotune checkout (NKI_KERNELS_EXT_DIR)",
)
def test_published_kernels_that_ran_on_hardware_plan_and_price_within_their_record():
    # nki-autotune's lhs_rhs matmul ran on trn2 but allocates 4 x 4 rotating groups and
    # uses 2 x 2 (256 KiB per partition allocated): the plan drops untouched allocations as
    # the compiler does, so it plans; every trn2 anchor is priced as fit_v3.json records
    anchors = [a for a in load_anchors() if a.target == "trn2"]
    aset = AnchorSet.build("trn2", anchors)
    assert not aset.unavailable
    rec = load_fit()["targets"]["trn2"]["anchors"]
    for aid, value in aset.price(get_target("trn2")).items():
        assert value == pytest.approx(rec[aid]["modeled_ns"], rel=1e-6), aid
    held = [a for a in anchors if a.held_out]
    assert len(held) == 6 and all(not a.fit for a in held)
