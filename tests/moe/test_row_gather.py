"""moe/row_gather.py: the dispatch / combine row gathers against float64 references:
weighted and plain sums, the dot products of the weight gradient, "nothing here"
indices (a zero row), NaN / Inf reaching only the rows that gather it, LNC 1 and 2,
16-bit sources, column chunks (H > 2048) and ragged row tiles."""

from __future__ import annotations

import pytest
import torch

from nki_kernels.moe.row_gather import gather_rows_dot, gather_rows_sum

# fp32 accumulation of k <= 4 products, one rounding to the output dtype
TOL = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _case(m: int, n: int, h: int, k: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randn(n, h, generator=g).to(dtype)
    index = torch.randint(0, n + 1, (m, k), generator=g).to(torch.int32)  # n: nothing
    weight = torch.randn(m, k, generator=g)
    ext = torch.cat([src.double(), torch.zeros(1, h, dtype=torch.float64)])
    return src, index, weight, ext[index.long()]  # gathered [m, k, h] float64


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    err = (got.double() - want).abs().max() / max(1e-3, float(want.abs().max()))
    assert err <= TOL[dtype], f"relative error {err:.3g}"


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize(
    ("m", "n", "h", "k", "dtype"),
    [(261, 300, 40, 3, torch.float32), (130, 50, 2100, 2, torch.bfloat16),
     (7, 9, 16, 4, torch.float16)],
)  # fmt: skip
def test_sums_and_dots(m: int, n: int, h: int, k: int, dtype: torch.dtype, lnc: int) -> None:
    src, index, weight, rows = _case(m, n, h, k, dtype)
    out = gather_rows_sum[lnc](src, index, weight, "float32")
    assert out.dtype == torch.float32
    _close(out, (weight.double()[..., None] * rows).sum(1), torch.float32)
    plain = gather_rows_sum[lnc](src, index, None, str(dtype).removeprefix("torch."))
    assert plain.dtype == dtype
    _close(plain, rows.sum(1), dtype)
    one = gather_rows_sum[lnc](src, index[:, :1], None, str(dtype).removeprefix("torch."))
    assert torch.equal(one.double(), rows[:, 0])  # a plain gather: the rows, bit for bit
    a = torch.randn(m, h, generator=torch.Generator().manual_seed(1))
    dots = gather_rows_dot[lnc](a, src, index)
    _close(dots, (a.double()[:, None, :] * rows).sum(-1), torch.float32)
    nothing = index == n
    assert nothing.any() and bool((dots[nothing] == 0).all())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_bad_source_row_reaches_only_the_rows_that_gather_it(bad: float) -> None:
    src, index, weight, _ = _case(40, 30, 24, 3, torch.float32, seed=2)
    src[7, 5] = bad
    out = gather_rows_sum(src, index, weight, "float32")
    hit = (index == 7).any(1)
    assert hit.any() and not hit.all()
    assert torch.isfinite(out[~hit]).all()
    assert not torch.isfinite(out[hit][:, 5]).any()
