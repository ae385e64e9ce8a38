"""torch.ops.nki.grouped_mm: torch._grouped_mm's 2-D x 3-D contract, forward and backward,
against a float64 reference; empty groups, rows past offs[-1], transposed weights,
torch.compile, the neuron device, the plan, bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import nki_kernels.ops.grouped_mm  # noqa: F401  (registers the op)
from nki_kernels.moe.group_plan import P, max_blocks, plan_row_blocks, plan_row_tiles
from nki_kernels.ops.grouped_mm import tile_sizes

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
# relative to the reference's largest magnitude: one output rounding plus fp32 sums
TOL = {F32: 1e-5, BF16: 2.0**-8, F16: 2.0**-10}


def reference(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """float64 loop over groups; rows past offs[-1] are zero."""
    out = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float64)
    lo = 0
    for g, hi in enumerate(offs.tolist()):
        out[lo:hi] = x[lo:hi].double() @ w[g].double()
        lo = hi
    return out


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    scale = max(1.0, float(expected.detach().abs().max()))
    err = float((actual.double() - expected).detach().abs().max()) / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]:.3g}"


def _case(m: int, k: int, n: int, offs: list[int], dtype: torch.dtype, seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(len(offs), k, n, generator=g) / k**0.5).to(dtype)
    return x, w, torch.tensor(offs, dtype=torch.int32)


def _fwd_bwd(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, fn: Any = None) -> None:
    dtype = x.dtype
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    op = fn or torch.ops.nki.grouped_mm
    out = op(xl, wl, offs)
    assert out.dtype == dtype and out.shape == (x.shape[0], w.shape[2])
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    out.backward(dy)
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    ref = reference(xr, wr, offs)
    ref.backward(dy.double())
    _close(out, ref, dtype, "out")
    assert xl.grad is not None and wl.grad is not None and xr.grad is not None
    assert wr.grad is not None
    _close(xl.grad, xr.grad, dtype, "d x")
    _close(wl.grad, wr.grad, dtype, "d w")


@pytest.mark.parametrize(
    ("m", "k", "n", "offs", "dtype"),
    [
        (300, 72, 200, [100, 100, 290, 290], F32),  # empty groups, rows past offs[-1]
        (37, 24, 20, [0, 10, 37], BF16),  # empty first group
        (130, 40, 140, [130], F16),  # one group holds every row
        (257, 136, 96, [1, 2, 129, 257], BF16),  # ragged K, groups of 1 row
        (64, 16, 8, [0, 0, 0], F32),  # every group empty: zeros, zero gradients
        (20, 2100, 520, [7, 20], F32),  # K in 3 weight units and 2 gather chunks, 2 N tiles
    ],
)
def test_forward_and_backward_match_the_float64_reference(
    m: int, k: int, n: int, offs: list[int], dtype: torch.dtype
) -> None:
    _fwd_bwd(*_case(m, k, n, offs, dtype))


def test_rows_past_the_last_offset_are_zero_and_get_zero_gradient() -> None:
    x, w, offs = _case(50, 16, 24, [20, 30], F32)
    xl = x.clone().requires_grad_()
    out = torch.ops.nki.grouped_mm(xl, w, offs)
    assert torch.equal(out[30:], torch.zeros(20, 24))
    out.backward(torch.ones_like(out))
    assert xl.grad is not None and torch.equal(xl.grad[30:], torch.zeros(20, 16))


def test_transposed_weight_view_as_torchtitan_passes_it() -> None:
    """TorchTitan calls _grouped_mm(x, w.transpose(-2, -1), offs) with w [G, N, K]."""
    x, w, offs = _case(90, 48, 40, [30, 30, 75], BF16, seed=3)
    w_nk = w.transpose(-2, -1).contiguous()
    _fwd_bwd(x, w_nk.transpose(-2, -1), offs)
    wl = w_nk.clone().requires_grad_()
    out = torch.ops.nki.grouped_mm(x, wl.transpose(-2, -1), offs)
    out.backward(torch.ones_like(out))
    assert wl.grad is not None and wl.grad.shape == w_nk.shape


def test_matches_torch_grouped_mm_where_torch_runs() -> None:
    x, w, offs = _case(96, 32, 16, [8, 8, 72], BF16, seed=4)
    ours = torch.ops.nki.grouped_mm(x, w, offs)
    theirs = torch._grouped_mm(x, w, offs=offs)
    _close(ours[:72], theirs[:72].double(), BF16, "vs torch._grouped_mm")


def test_nan_row_stays_in_its_row_and_its_group_weight_gradient() -> None:
    x, w, offs = _case(40, 16, 8, [10, 25, 40], F32, seed=5)
    x[3, 2] = float("nan")
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = torch.ops.nki.grouped_mm(xl, wl, offs)
    bad_rows = (~torch.isfinite(out)).any(dim=1).nonzero().flatten().tolist()
    assert bad_rows == [3]
    out.backward(torch.ones_like(out))
    assert wl.grad is not None and xl.grad is not None
    assert not torch.isfinite(wl.grad[0]).all()
    assert torch.isfinite(wl.grad[1:]).all()
    assert torch.isfinite(xl.grad).all()  # dx = dy @ w^T reads no x


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_torch_compile_fullgraph(device: str, request: pytest.FixtureRequest) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    x, w, offs = _case(70, 24, 40, [5, 5, 60], F32, seed=6)

    def layer(a: torch.Tensor, b: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(torch.ops.nki.grouped_mm(a, b, o))

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    xl = x.clone().to(device).requires_grad_()
    wl = w.clone().to(device).requires_grad_()
    out = compiled(xl, wl, offs.to(device))
    out.sum().backward()
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    ref = torch.nn.functional.silu(reference(xr, wr, offs))
    ref.sum().backward()
    assert out.device.type == torch.device(device).type
    _close(out.cpu(), ref, F32, "out")
    assert xl.grad is not None and wl.grad is not None and xr.grad is not None
    assert wr.grad is not None
    _close(xl.grad.cpu(), xr.grad, F32, "d x")
    _close(wl.grad.cpu(), wr.grad, F32, "d w")


def test_lnc2_matches_lnc1() -> None:
    from nki_kernels.runtime import lnc as runtime_lnc

    x, w, offs = _case(300, 40, 600, [100, 100, 290], BF16, seed=8)
    dy = torch.randn(300, 600, generator=torch.Generator().manual_seed(9)).to(BF16)
    results = []
    for lnc in (1, 2):
        runtime_lnc.set_runtime_lnc(lnc)
        try:
            xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
            out = torch.ops.nki.grouped_mm(xl, wl, offs)
            out.backward(dy)
            results.append((out, xl.grad, wl.grad))
        finally:
            runtime_lnc.set_runtime_lnc(None)
    (out1, dx1, dw1), (out2, dx2, dw2) = results
    assert torch.equal(out1, out2) and torch.equal(dx1, dx2)  # same blocks, same arithmetic
    # dW: each program owns half of the columns, so its gathered dy tiles are narrower;
    # the host BLAS behind the interpreter's fp32 matmul may then sum in another order
    xr = x.double()
    for g, (lo, hi) in enumerate(((0, 100), (100, 100), (100, 290))):
        expected = xr[lo:hi].T @ dy[lo:hi].double()
        _close(dw1[g], expected, BF16, f"dW[{g}] at LNC 1")
        _close(dw2[g], expected, BF16, f"dW[{g}] at LNC 2")


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (lambda x, w, o: (x, w, torch.tensor([5, 3, 9], dtype=torch.int32)), "non-decreasing"),
        (lambda x, w, o: (x, w, torch.tensor([5, 6, 41], dtype=torch.int32)), r"offs: .*\[0, 40\]"),
        (lambda x, w, o: (x, w, o.long()), "offs: expected dtype"),
        (lambda x, w, o: (x, w, o[:2]), r"offs: expected shape \(3,\)"),
        (lambda x, w, o: (x, w.bfloat16(), o), "w: expected dtype"),
        (lambda x, w, o: (x[:, :5], w, o), "w: expected .*K=5"),
        (lambda x, w, o: (x, w[0], o), "w: expected 3 dims .*grouped_mm_weight_grad"),
    ],
)
def test_bad_input_names_the_argument(args: Any, match: str) -> None:
    x, w, offs = _case(40, 8, 4, [5, 6, 9], F32)
    with pytest.raises((ValueError, TypeError), match=match):
        torch.ops.nki.grouped_mm(*args(x, w, offs))


# ---- the plan ---------------------------------------------------------------------------
def test_plan_pads_each_group_to_128_rows_only_and_skips_empty_groups() -> None:
    offs = np.array([0, 1030, 1030, 1100, 1700], dtype=np.int32)
    plan = plan_row_blocks(offs, 1800, 512)
    # groups of 1030, 70 and 600 rows: 9 + 1 + 5 sub-tiles = 15 * 128 slots
    assert plan.padded_rows == 15 * P
    sizes = {}
    for b in range(plan.used_blocks):
        rows = plan.slot_rows[b][plan.slot_rows[b] < 1800]
        g = int(plan.block_group[b, 0])
        sizes.setdefault(g, []).append(len(rows))
        assert np.all(np.diff(np.sort(rows)) == 1)  # contiguous rows of one group
    assert set(sizes) == {1, 3, 4}  # empty groups 0 and 2 have no block
    # 1030 rows = 9 sub-tiles in 3 blocks of 3 (not 4 + 4 + 1): near-equal blocks
    assert sorted(sizes[1]) == [262, 384, 384]
    assert sorted(sizes[4]) == [216, 384]  # 600 rows: 5 sub-tiles as 3 + 2
    covered = np.sort(plan.slot_rows[: plan.used_blocks][plan.slot_rows[: plan.used_blocks] < 1800])
    assert np.array_equal(covered, np.arange(1700))
    kinds = [int((plan.slot_rows[b] < 1800).any(axis=0).sum()) for b in range(plan.used_blocks)]
    assert kinds == sorted(kinds, reverse=True)
    bounds = plan.kind_bounds[0]
    for j in range(4):  # blocks of 4 - j sub-tiles are [bounds[j], bounds[j + 1])
        assert all(
            int(plan.slot_rows[b, 0, 3 - j]) < 1800 or 3 - j == 0
            for b in range(bounds[j], bounds[j + 1])
        )
    assert bounds[-2] == plan.used_blocks
    # rows 1700..1799 are in no group: one zero block, after the others
    assert bounds[-1] == plan.used_blocks + 1 <= max_blocks(1800, 5, 512, tail=True)
    tail = plan.slot_rows[plan.used_blocks]
    assert np.array_equal(np.sort(tail[tail < 1800]), np.arange(1700, 1800))


def test_tile_plan_and_the_static_bound_hold_for_the_worst_routing() -> None:
    rows, groups = 1000, 8
    worst = np.minimum(np.arange(1, groups + 1) * 129, rows).astype(np.int32)
    for bs in (128, 256, 512):
        plan = plan_row_blocks(worst, rows, bs)
        assert plan.used_blocks <= plan.slot_rows.shape[0] == max_blocks(rows, groups, bs, True)
    tp = plan_row_tiles(worst, rows)
    counts = np.diff(tp.group_bounds[0])
    assert counts.tolist() == [-(-int(n) // P) for n in np.diff(np.r_[0, worst])]


def test_tile_sizes_fit_the_sbuf_budget() -> None:
    assert tile_sizes(4096, 14336, 2)[0] == 512
    assert tile_sizes(14336, 4096, 2)[0] == 512  # K-chunked weight units: big K fits
    assert tile_sizes(7168, 2048, 4)[0] == 384  # fp32 at K = 7168: smaller blocks
