"""The forward kernels' small-hidden tilings: the heuristic's row grouping (several rows
per partition per tile at H = 128 / 512), quarter-row chunks for few rows (H >= 1024) and
LayerNorm's few-row statistics, on row counts that divide neither 128 nor the tile's
rows, against the fp32 references; a NaN row stays in its row; kernel[2] gives kernel[1]'s
bits."""

from __future__ import annotations

import norm_helpers as nh
import pytest
import torch

from nki_kernels.interp import run
from nki_kernels.norm import config as C
from nki_kernels.norm import reference as ref
from nki_kernels.norm.layernorm import layer_norm_fwd
from nki_kernels.norm.rmsnorm import add_rms_norm_fwd, rms_norm_fwd
from nki_kernels.targets import get_target

NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
TARGET = get_target("trn2")

# (rows, hidden, dtype, the heuristic's rows_per_partition and chunk); no row count is a
# multiple of 128 * rows_per_partition
CASES = [
    (1000, 128, torch.bfloat16, 4, 128),
    (700, 128, torch.float32, 2, 128),
    (1300, 512, torch.bfloat16, 2, 512),
    (200, 1536, torch.float16, 1, 512),
    (130, 2048, torch.bfloat16, 1, 512),
]


def _cfg(cls: type, rows: int, hidden: int, dtype: torch.dtype, affine: str, **over: object):
    problem = C.NormProblem(rows, hidden, NAMES[dtype], affine)
    cfg = C.replace(cls.heuristic(problem, TARGET), **over)
    cfg.validate(problem, TARGET)
    return cfg


@pytest.mark.parametrize("rows,hidden,dtype,kk,chunk", CASES)
def test_heuristic_small_hidden_tilings(
    rows: int, hidden: int, dtype: torch.dtype, kk: int, chunk: int
) -> None:
    x, r = nh.make((rows, hidden), dtype, 41), nh.make((rows, hidden), dtype, 42)
    w = nh.make((hidden,), dtype, 43, loc=1.0)
    cfg = _cfg(C.RMSNormConfig, rows, hidden, dtype, "w")
    share = 4 if dtype == torch.float32 else 0  # fp32: no VectorE perf mode to protect
    assert (cfg.rows_per_partition, cfg.chunk, cfg.gpsimd_eighths) == (kk, chunk, share)
    y, rstd = run(rms_norm_fwd, x, w, nh.EPS, target=TARGET, **cfg.to_dict()).outputs
    nh.assert_within("y", y, *nh.rms_fwd_bound(x, w, *nh.TOL[dtype]))
    _, rr = ref.rms_norm_ref(x, None, nh.EPS)
    nh.assert_within("rstd", rstd, rr, 2.0**-20 * rr)

    acfg = _cfg(C.AddRMSNormConfig, rows, hidden, dtype, "w").to_dict()
    y, h, rstd = run(add_rms_norm_fwd, x, r, w, nh.EPS, target=TARGET, **acfg).outputs
    _, hr, rr = ref.add_rms_norm_ref(x, r, w, nh.EPS)
    assert torch.equal(h, hr), "h = x + residual must round exactly like the unfused add"
    nh.assert_within("y", y, *nh.rms_fwd_bound(hr, w, *nh.TOL[dtype]))
    nh.assert_within("rstd", rstd, rr, 2.0**-20 * rr)

    xl = nh.make((rows, hidden), dtype, 44, loc=3.0)  # offset mean
    b = nh.make((hidden,), dtype, 45)
    lcfg = _cfg(C.LayerNormConfig, rows, hidden, dtype, "wb")
    if rows <= C.FEW_ROWS and dtype != torch.float32:
        assert (lcfg.stats, lcfg.scale_mode) == ("mixed", "vector")
    y, _, _ = run(layer_norm_fwd, xl, w, b, 1e-5, target=TARGET, **lcfg.to_dict()).outputs
    nh.assert_within("layer_norm y", y, *nh.ln_fwd_bound(xl, w, b, *nh.TOL[dtype]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_grouped_rows_at_1536(dtype: torch.dtype) -> None:
    """Two rows per partition at H = 1536 (the heuristic's choice from ~3000 rows; forced
    here on 300 rows: a ragged last tile of 44 rows)."""
    rows, hidden = 300, 1536
    x, w = nh.make((rows, hidden), dtype, 46), nh.make((hidden,), dtype, 47, loc=1.0)
    cfg = _cfg(C.RMSNormConfig, rows, hidden, dtype, "w", rows_per_partition=2).to_dict()
    y, _ = run(rms_norm_fwd, x, w, nh.EPS, target=TARGET, **cfg).outputs
    nh.assert_within("y", y, *nh.rms_fwd_bound(x, w, *nh.TOL[dtype]))


@pytest.mark.parametrize("rows,hidden,dtype,kk,chunk", CASES[:1] + CASES[3:4])
def test_nan_row_stays_in_its_row(
    rows: int, hidden: int, dtype: torch.dtype, kk: int, chunk: int
) -> None:
    x, w = nh.make((rows, hidden), dtype, 48), nh.make((hidden,), dtype, 49, loc=1.0)
    bad = rows - 3  # in the ragged last tile
    x[bad, hidden // 2] = float("nan")
    y, _ = rms_norm_fwd(x, w, nh.EPS, **_cfg(C.RMSNormConfig, rows, hidden, dtype, "w").to_dict())
    lcfg = _cfg(C.LayerNormConfig, rows, hidden, dtype, "wb").to_dict()
    yl, _, _ = layer_norm_fwd(x, w, w, 1e-5, **lcfg)
    for out in (y, yl):
        finite = torch.isfinite(out.float()).all(dim=-1)
        assert not finite[bad] and finite[torch.arange(rows) != bad].all()


def test_lnc2_matches_lnc1_bitwise() -> None:
    x, w = nh.make((1000, 128), torch.bfloat16, 50), nh.make((128,), torch.bfloat16, 51, loc=1.0)
    cfg = _cfg(C.RMSNormConfig, 1000, 128, torch.bfloat16, "w").to_dict()
    one, two = rms_norm_fwd(x, w, nh.EPS, **cfg), rms_norm_fwd[2](x, w, nh.EPS, **cfg)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
