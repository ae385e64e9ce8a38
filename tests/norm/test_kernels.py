"""The NKI norm kernels in the interpreter against the fp32 references.

Forward and backward on aligned and odd shapes (rows not a multiple of 128, H not a
multiple of 128 or 512, streaming and resident plans, several rows per partition),
with each kernel's heuristic config and with hand-picked schedule variants.
"""

from __future__ import annotations

import norm_helpers as nh
import pytest
import torch

from nki_kernels.interp import run
from nki_kernels.norm import config as C
from nki_kernels.norm import reference as ref
from nki_kernels.norm.layernorm import layer_norm_fwd, layer_norm_stats
from nki_kernels.norm.layernorm_bwd import layer_norm_bwd
from nki_kernels.norm.rmsnorm import add_rms_norm_fwd, rms_norm_fwd, rms_norm_stats
from nki_kernels.norm.rmsnorm_bwd import rms_norm_bwd
from nki_kernels.targets import get_target

NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
TARGET = get_target("trn2")

# (rows, hidden, dtype): odd and aligned; rows % 128 != 0; wide rows.
SHAPES = [
    (7, 1000, torch.float32),
    (300, 256, torch.bfloat16),
    (130, 1000, torch.float16),
    (384, 512, torch.bfloat16),
]


def _cfg(cls: type, rows: int, hidden: int, dtype: torch.dtype, affine: str, **over: object):
    problem = C.NormProblem(rows, hidden, NAMES[dtype], affine)
    cfg = cls.heuristic(problem, TARGET)
    cfg = C.replace(cfg, **over) if over else cfg
    cfg.validate(problem, TARGET)
    return cfg.to_dict()


@pytest.mark.parametrize("rows,hidden,dtype", SHAPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_fwd(rows: int, hidden: int, dtype: torch.dtype, weighted: bool) -> None:
    x = nh.make((rows, hidden), dtype, 1)
    w = nh.make((hidden,), dtype, 2, loc=1.0) if weighted else None
    cfg = _cfg(C.RMSNormConfig, rows, hidden, dtype, "w" if weighted else "none")
    y, rstd = run(rms_norm_fwd, x, w, nh.EPS, target=TARGET, **cfg).outputs
    yr, bound = nh.rms_fwd_bound(x, w, *nh.TOL[dtype])
    assert y.dtype == dtype
    nh.assert_within("y", y, yr, bound)
    _, rr = ref.rms_norm_ref(x, None, nh.EPS)
    nh.assert_within("rstd", rstd, rr, 2.0**-20 * rr)


@pytest.mark.parametrize(
    "over",
    [
        {"resident": False, "chunk": 384, "bufs": 2},
        {"resident": False, "chunk": 512, "bufs": 3, "scale_mode": "scalar"},
        {"rows_per_partition": 2, "gpsimd_eighths": 8},
        {"chunk": 512, "bufs": 4, "gpsimd_eighths": 2},
    ],
)
def test_rms_and_add_fwd_schedules(over: dict) -> None:
    rows, hidden, dtype = 300, 1100, torch.bfloat16
    x, r = nh.make((rows, hidden), dtype, 3), nh.make((rows, hidden), dtype, 4)
    w = nh.make((hidden,), dtype, 5, loc=1.0)
    cfg = _cfg(C.RMSNormConfig, rows, hidden, dtype, "w", **over)
    y, _ = run(rms_norm_fwd, x, w, nh.EPS, target=TARGET, **cfg).outputs
    nh.assert_within("y", y, *nh.rms_fwd_bound(x, w, *nh.TOL[dtype]))
    acfg = _cfg(C.AddRMSNormConfig, rows, hidden, dtype, "w", **over)
    y, h, rstd = run(add_rms_norm_fwd, x, r, w, nh.EPS, target=TARGET, **acfg).outputs
    _, hr, rr = ref.add_rms_norm_ref(x, r, w, nh.EPS)
    assert torch.equal(h, hr), "h = x + residual must round exactly like the unfused add"
    nh.assert_within("y", y, *nh.rms_fwd_bound(hr, w, *nh.TOL[dtype]))
    nh.assert_within("rstd", rstd, rr, 2.0**-20 * rr)


def test_rms_norm_wide_rows() -> None:
    """H = 16384 with a ragged row count: the heuristic plan and a streaming plan."""
    rows, hidden, dtype = 130, 16384, torch.bfloat16
    x, w = nh.make((rows, hidden), dtype, 6), nh.make((hidden,), dtype, 7, loc=1.0)
    yr, bound = nh.rms_fwd_bound(x, w, *nh.TOL[dtype])
    for over in ({}, {"resident": False, "chunk": 4096, "bufs": 2}):
        cfg = _cfg(C.RMSNormConfig, rows, hidden, dtype, "w", **over)
        y, _ = run(rms_norm_fwd, x, w, nh.EPS, target=TARGET, **cfg).outputs
        nh.assert_within(f"y {over}", y, yr, bound)


@pytest.mark.parametrize("rows,hidden,dtype", SHAPES)
@pytest.mark.parametrize("affine", ["wb", "w", "b", "none"])
def test_layer_norm_fwd(rows: int, hidden: int, dtype: torch.dtype, affine: str) -> None:
    x = nh.make((rows, hidden), dtype, 8, loc=3.0)  # an offset mean: the shifted sums matter
    w = nh.make((hidden,), dtype, 9, loc=1.0) if "w" in affine else None
    b = nh.make((hidden,), dtype, 10) if "b" in affine else None
    cfg = _cfg(C.LayerNormConfig, rows, hidden, dtype, affine)
    y, mean, rstd = run(layer_norm_fwd, x, w, b, 1e-5, target=TARGET, **cfg).outputs
    yr, bound = nh.ln_fwd_bound(x, w, b, *nh.TOL[dtype])
    nh.assert_within("y", y, yr, bound)
    _, mr, rr = ref.layer_norm_ref(x, None, None, 1e-5)
    h = hidden
    nh.assert_within("mean", mean, mr, 4 * (h**0.5) * 2.0**-24 * x.float().abs().mean(-1))
    nh.assert_within("rstd", rstd, rr, 2.0**-16 * rr)


@pytest.mark.parametrize(
    "over",
    [
        {"stats": "scalar", "scale_mode": "scalar"},
        {"stats": "bn", "resident": False, "chunk": 512, "bufs": 3},
        {"stats": "mixed", "rows_per_partition": 2, "gpsimd_eighths": 4},
    ],
)
def test_layer_norm_fwd_schedules(over: dict) -> None:
    rows, hidden, dtype = 300, 1100, torch.bfloat16
    x = nh.make((rows, hidden), dtype, 11, loc=-2.0)
    w, b = nh.make((hidden,), dtype, 12, loc=1.0), nh.make((hidden,), dtype, 13)
    cfg = _cfg(C.LayerNormConfig, rows, hidden, dtype, "wb", **over)
    y, _, _ = run(layer_norm_fwd, x, w, b, 1e-5, target=TARGET, **cfg).outputs
    nh.assert_within(f"y {over}", y, *nh.ln_fwd_bound(x, w, b, *nh.TOL[dtype]))


def test_statistics_kernels() -> None:
    """The backward's statistics recomputation matches the forward's saved statistics."""
    x = nh.make((300, 1000), torch.bfloat16, 14, loc=1.0)
    _, rstd = rms_norm_fwd(x, None, nh.EPS)
    assert torch.equal(rms_norm_stats(x, nh.EPS), rstd)
    _, mean, rstd = layer_norm_fwd(x, None, None, 1e-5)
    m2, r2 = layer_norm_stats(x, 1e-5)
    assert torch.equal(m2, mean) and torch.equal(r2, rstd)


@pytest.mark.parametrize("rows,hidden,dtype", SHAPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_bwd(rows: int, hidden: int, dtype: torch.dtype, weighted: bool) -> None:
    x, dy = nh.make((rows, hidden), dtype, 15), nh.make((rows, hidden), dtype, 16)
    w = nh.make((hidden,), dtype, 17, loc=1.0) if weighted else None
    _, rstd = ref.rms_norm_ref(x, None, nh.EPS)
    cfg = _cfg(C.RMSNormBwdConfig, rows, hidden, dtype, "w" if weighted else "none")
    out = run(rms_norm_bwd, dy, x, w, rstd, target=TARGET, **cfg).outputs
    dx, dw = out if weighted else (out, None)
    want = nh.rms_bwd_bounds(dy, x, w, *nh.TOL[dtype])
    nh.check_all({"dx": dx, "dw": dw}, want, "rms_norm_bwd")


@pytest.mark.parametrize(
    "over",
    [
        {"resident": False, "chunk": 512, "bufs": 2},
        {"rows_per_partition": 2, "gpsimd_eighths": 6, "chunk": 512},
    ],
)
def test_rms_norm_bwd_schedules_and_dh(over: dict) -> None:
    rows, hidden, dtype = 300, 1100, torch.bfloat16
    x, dy, dh = (nh.make((rows, hidden), dtype, s) for s in (18, 19, 20))
    w = nh.make((hidden,), dtype, 21, loc=1.0)
    _, rstd = ref.rms_norm_ref(x, None, nh.EPS)
    cfg = _cfg(C.AddRMSNormBwdConfig, rows, hidden, dtype, "w", **over)
    dx, dw = run(rms_norm_bwd, dy, x, w, rstd, dh, target=TARGET, **cfg).outputs
    want = nh.rms_bwd_bounds(dy, x, w, *nh.TOL[dtype])
    rdx, bdx = want["dx"]
    want["dx"] = (rdx + dh.float(), bdx + nh.TOL[dtype][0] * dh.float().abs())
    nh.check_all({"dx": dx, "dw": dw}, want, f"rms_norm_bwd + dh {over}")


@pytest.mark.parametrize("rows,hidden,dtype", SHAPES)
@pytest.mark.parametrize("affine", ["wb", "w", "b", "none"])
def test_layer_norm_bwd(rows: int, hidden: int, dtype: torch.dtype, affine: str) -> None:
    x, dy = nh.make((rows, hidden), dtype, 22, loc=2.0), nh.make((rows, hidden), dtype, 23)
    w = nh.make((hidden,), dtype, 24, loc=1.0) if "w" in affine else None
    b = nh.make((hidden,), dtype, 25) if "b" in affine else None
    _, mean, rstd = ref.layer_norm_ref(x, None, None, 1e-5)
    cfg = _cfg(C.LayerNormBwdConfig, rows, hidden, dtype, affine)
    dx, dw, db = run(
        layer_norm_bwd, dy, x, w, b is not None, mean, rstd, target=TARGET, **cfg
    ).outputs
    assert (dw is None) == (w is None) and (db is None) == (b is None)
    want = nh.ln_bwd_bounds(dy, x, w, b, *nh.TOL[dtype])
    nh.check_all({"dx": dx, "dw": dw, "db": db}, want, "layer_norm_bwd")


@pytest.mark.parametrize(
    "rows,hidden,dtype,loc",
    [
        (300, 256, torch.bfloat16, 2.0),
        (7, 1000, torch.float32, 3.0),
        (130, 640, torch.float16, -3.0),
    ],
)
def test_backward_computes_its_statistics(
    rows: int, hidden: int, dtype: torch.dtype, loc: float
) -> None:
    """Resident plans given no statistics compute them from x as the forward does (an
    offset mean for LayerNorm: its shifted sums matter), for RMSNorm (with dh) and LayerNorm."""
    x, dy = nh.make((rows, hidden), dtype, 40), nh.make((rows, hidden), dtype, 41)
    dh = nh.make((rows, hidden), dtype, 42)
    w = nh.make((hidden,), dtype, 43, loc=1.0)
    cfg = _cfg(C.AddRMSNormBwdConfig, rows, hidden, dtype, "w")
    assert C.AddRMSNormBwdConfig(**cfg).inline_stats()
    dx, dw = run(rms_norm_bwd, dy, x, w, None, dh, eps=nh.EPS, target=TARGET, **cfg).outputs
    want = nh.rms_bwd_bounds(dy, x, w, *nh.TOL[dtype])
    rdx, bdx = want["dx"]
    want["dx"] = (rdx + dh.float(), bdx + nh.TOL[dtype][0] * dh.float().abs())
    nh.check_all({"dx": dx, "dw": dw}, want, "rms_norm_bwd, in-kernel rstd")
    x = nh.make((rows, hidden), dtype, 44, loc=loc)
    for affine in ("wb", "b"):
        wl = w if "w" in affine else None
        cfg = _cfg(C.LayerNormBwdConfig, rows, hidden, dtype, affine)
        dx, dw, db = run(
            layer_norm_bwd, dy, x, wl, True, None, None, eps=1e-5, target=TARGET, **cfg
        ).outputs
        want = nh.ln_bwd_bounds(dy, x, wl, w, *nh.TOL[dtype])
        got = {"dx": dx, "dw": dw, "db": db}
        nh.check_all(got, want, f"layer_norm_bwd {affine}, in-kernel mean / rstd")


def test_backward_wide_rows_streaming() -> None:
    """H = 16384 backward (the heuristic streams column chunks) with a ragged row count."""
    rows, hidden, dtype = 130, 16384, torch.bfloat16
    x, dy = nh.make((rows, hidden), dtype, 26), nh.make((rows, hidden), dtype, 27)
    w = nh.make((hidden,), dtype, 28, loc=1.0)
    _, rstd = ref.rms_norm_ref(x, None, nh.EPS)
    cfg = _cfg(C.RMSNormBwdConfig, rows, hidden, dtype, "w")
    dx, dw = run(rms_norm_bwd, dy, x, w, rstd, target=TARGET, **cfg).outputs
    nh.check_all({"dx": dx, "dw": dw}, nh.rms_bwd_bounds(dy, x, w, *nh.TOL[dtype]), "H=16384")


def test_forward_kernels_split_rows_across_lnc2() -> None:
    """kernel[2]: each core takes a contiguous range of row tiles (the tail on the last)."""
    x = nh.make((1000, 512), torch.bfloat16, 29)
    w = nh.make((512,), torch.bfloat16, 30, loc=1.0)
    for one, two in (
        (rms_norm_fwd(x, w, nh.EPS), rms_norm_fwd[2](x, w, nh.EPS)),
        (layer_norm_fwd(x, w, w, 1e-5), layer_norm_fwd[2](x, w, w, 1e-5)),
        (add_rms_norm_fwd(x, x, w, nh.EPS), add_rms_norm_fwd[2](x, x, w, nh.EPS)),
    ):
        assert all(torch.equal(a, b) for a, b in zip(one, two))


@pytest.mark.parametrize("rows,hidden,dtype", SHAPES)
def test_backward_kernels_split_rows_across_lnc2(
    rows: int, hidden: int, dtype: torch.dtype
) -> None:
    """kernel[2]: each core takes its row tiles (7 rows: core 0 has none) and writes its
    fp32 column sums to its own row of dw / db, [2, H]; their sum meets the bounds."""
    x, dy = nh.make((rows, hidden), dtype, 31), nh.make((rows, hidden), dtype, 32)
    w = nh.make((hidden,), dtype, 33, loc=1.0)
    _, rstd = ref.rms_norm_ref(x, None, nh.EPS)
    cfg = _cfg(C.RMSNormBwdConfig, rows, hidden, dtype, "w")
    dx, parts = rms_norm_bwd[2](dy, x, w, rstd, None, nh.EPS, **cfg)
    assert parts.shape == (2, hidden) and parts.dtype == torch.float32
    dw = parts.sum(0).to(dtype)
    nh.check_all({"dx": dx, "dw": dw}, nh.rms_bwd_bounds(dy, x, w, *nh.TOL[dtype]), "rms lnc2")
    x = nh.make((rows, hidden), dtype, 34, loc=2.0)
    _, mean, rstd = ref.layer_norm_ref(x, None, None, 1e-5)
    cfg = _cfg(C.LayerNormBwdConfig, rows, hidden, dtype, "wb")
    dx, pw, pb = layer_norm_bwd[2](dy, x, w, True, mean, rstd, 1e-5, **cfg)
    got = {"dx": dx, "dw": pw.sum(0).to(dtype), "db": pb.sum(0).to(dtype)}
    nh.check_all(got, nh.ln_bwd_bounds(dy, x, w, w, *nh.TOL[dtype]), "layer_norm lnc2")
