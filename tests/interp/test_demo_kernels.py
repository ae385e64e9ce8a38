"""The demo kernels (nki_kernels.examples) on odd shapes, in both dtypes, under LNC1 and LNC2,
against their NumPy references; plus exact instruction counts of the matmul's trace."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from nki_kernels.examples import matmul_at_b, matmul_at_b_reference, rmsnorm, rmsnorm_reference
from nki_kernels.examples.matmul_at_b import TILE_K, TILE_M, TILE_N
from nki_kernels.interp import TensorSpec, run

BF16 = np.dtype(ml_dtypes.bfloat16)
# Relative tolerance per output dtype: kernel and reference each round once to the output
# dtype from fp32 values that differ only by summation order, so they agree within one ulp
# of the output dtype: 2^-7 relative for bf16 (8 significant bits, worst case at the bottom
# of a binade), 2^-20 for fp32 (a few fp32 ulps of accumulation-order slack).
RTOL = {np.dtype(np.float32): 2**-20, BF16: 2**-7}
rng = np.random.default_rng(2024)


def _matmul_atol(a: np.ndarray, b: np.ndarray) -> float:
    """fp32 summation-order error bound: K terms of |a||b| at 2^-23 relative each."""
    k = a.shape[0]
    return float(
        k * 2.0**-23 * np.abs(a.astype(np.float32)).max() * np.abs(b.astype(np.float32)).max()
    )


def _check_matmul(got, a, b):
    ref = a.astype(np.float64).T @ b.astype(np.float64)
    assert got.shape == ref.shape and got.dtype == a.dtype
    np.testing.assert_allclose(
        got.astype(np.float64), ref, rtol=RTOL[a.dtype], atol=_matmul_atol(a, b)
    )


@pytest.mark.parametrize(
    ("k", "m", "n", "dtype"),
    [
        (300, 200, 1000, np.float32),
        (77, 130, 600, BF16),
        (1, 1, 1, np.float32),
        (256, 128, 512, BF16),
    ],
)
def test_matmul_odd_shapes(k, m, n, dtype):
    a = rng.standard_normal((k, m)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    _check_matmul(matmul_at_b(a, b), a, b)


def test_matmul_lnc2_splits_column_blocks_between_programs():
    a = rng.standard_normal((300, 200)).astype(BF16)
    b = rng.standard_normal((300, 1000)).astype(BF16)
    res = run(matmul_at_b, a, b, lnc=2)
    _check_matmul(res.outputs, a, b)
    np.testing.assert_array_equal(res.outputs, matmul_at_b(a, b))
    per_program = [
        [i for i in res.trace if i.program == p and i.opcode == "nc_matmul"] for p in (0, 1)
    ]
    # 2 column blocks (1000 / 512), 2 row tiles, 3 contraction tiles: 6 matmuls each
    assert [len(x) for x in per_program] == [6, 6]
    assert {i.attrs["N"] for i in per_program[0]} == {512}
    assert {i.attrs["N"] for i in per_program[1]} == {1000 - 512}


def test_matmul_torch_tensors_and_reference_helper():
    a = torch.randn(130, 70, dtype=torch.bfloat16)
    b = torch.randn(130, 90, dtype=torch.bfloat16)
    got = matmul_at_b[2](a, b)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    ref = matmul_at_b_reference(a.float().numpy(), b.float().numpy())
    np.testing.assert_allclose(got.float().numpy(), ref, rtol=2**-8, atol=1e-3)


def test_matmul_trace_has_the_exact_instruction_counts():
    k, m, n = 1000, 700, 1500
    res = run(matmul_at_b, TensorSpec((k, m), BF16), TensorSpec((k, n), BF16), trace_only=True)
    kt, mt, nb = -(-k // TILE_K), -(-m // TILE_M), -(-n // TILE_N)  # 8, 6, 3
    assert res.trace.count(opcode="nc_matmul") == nb * mt * kt  # 144
    assert res.trace.count(opcode="tensor_copy") == nb * mt  # PSUM evacuations: 18
    # B loads once per (block, k tile), A per (block, row tile, k tile), C per output tile
    assert res.trace.count(opcode="dma_copy") == nb * kt + nb * mt * kt + nb * mt  # 186
    assert res.trace.flops == 2 * k * m * n
    assert res.peak_psum_banks == 2  # the accumulator double-buffers across row tiles


def _check_rmsnorm(got, x, w, eps):
    ref = rmsnorm_reference(x, w, eps)
    assert got.shape == x.shape and got.dtype == x.dtype
    np.testing.assert_allclose(
        got.astype(np.float64), ref.astype(np.float64), rtol=RTOL[x.dtype], atol=1e-6
    )


@pytest.mark.parametrize(
    ("n", "h", "dtype"),
    [(300, 1000, BF16), (300, 1000, np.float32), (1, 5000, np.float32), (129, 3, BF16)],
)
def test_rmsnorm_odd_shapes(n, h, dtype):
    x = (rng.standard_normal((n, h)) * 3).astype(dtype)
    w = rng.standard_normal(h).astype(dtype)
    _check_rmsnorm(rmsnorm(x, w, 1e-5), x, w, 1e-5)


def test_rmsnorm_lnc2_splits_row_tiles():
    x = rng.standard_normal((300, 1000)).astype(BF16)
    w = rng.standard_normal(1000).astype(BF16)
    res = run(rmsnorm, x, w, lnc=2)
    _check_rmsnorm(res.outputs, x, w, 1e-6)
    stores = [
        (i.program, i.p)
        for i in res.trace
        if i.opcode == "dma_copy" and i.attrs["dst_space"] == "shared_hbm"
    ]
    # 3 row tiles of 128, 128, 44 rows: program 0 takes the first, program 1 the other two
    assert stores == [(0, 128), (1, 128), (1, 44)]


def test_rmsnorm_runs_on_every_target():
    x = rng.standard_normal((40, 96)).astype(np.float32)
    w = np.ones(96, np.float32)
    for target in ("trn1", "trn2", "trn3"):
        _check_rmsnorm(run(rmsnorm, x, w, target=target).outputs, x, w, 1e-6)


@pytest.mark.parametrize(
    ("kernel", "args", "message"),
    [
        (matmul_at_b, (np.ones(4, np.float32), np.ones((4, 2), np.float32)), "must be 2-D"),
        (matmul_at_b, (np.ones((4, 3), np.float32), np.ones((5, 2), np.float32)), "K differs"),
        (rmsnorm, (np.ones((2, 3, 4), np.float32), np.ones(4, np.float32)), "x must be 2-D"),
        (rmsnorm, (np.ones((2, 4), np.float32), np.ones(3, np.float32)), "w must be [4]"),
        (rmsnorm, (np.ones((2, 4), np.float32), np.ones(4, np.float32), 0.0), "eps must be"),
    ],
)
def test_bad_shapes_fail_with_a_message_naming_the_argument(kernel, args, message):
    with pytest.raises(AssertionError) as e:
        kernel(*args)
    assert message in str(e.value)
