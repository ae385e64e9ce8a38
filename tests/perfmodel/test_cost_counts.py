"""Exact counts the estimate reports for small kernels (arithmetic in the comments)."""

from __future__ import annotations

import pytest

from nki_kernels.interp import TensorSpec
from nki_kernels.perfmodel import estimate, trace_kernel
from nki_kernels.perfmodel.calibration import (
    dma_sweep,
    matmul_fully_blocked,
    matmul_hoisted,
    matmul_tiled,
)
from nki_kernels.perfmodel.synthetic import synthetic_trace

M, K, N = 256, 256, 1024  # lhsT [K, M], rhs [K, N], bf16
SPECS = (TensorSpec((K, M), "bfloat16"), TensorSpec((K, N), "bfloat16"))


def test_tiled_matmul_counts():
    est = estimate(matmul_tiled, *SPECS, target="trn1")
    # output tiles: (256 / 128) x (1024 / 512) = 4; k steps per tile: 256 / 128 = 2
    assert est.counts["tensor"] == 4 * 2  # 8 matmuls
    assert est.counts["dma"] == 4 * 2 * 2 + 4  # 2 loads per matmul + 1 store per tile = 20
    assert est.counts["vector"] == 4  # one PSUM evacuation per tile
    assert est.flops == 2 * M * K * N == 134_217_728
    assert est.hw_flops == est.flops  # no transposes
    # each matmul loads a 128x128 lhsT tile (32 KiB) and a 128x512 rhs tile (128 KiB)
    assert est.hbm_read_bytes == 8 * (128 * 128 * 2 + 128 * 512 * 2) == 1_310_720
    assert est.hbm_write_bytes == M * N * 2 == 524_288  # C once, bf16
    assert est.dma_bytes == est.hbm_read_bytes + est.hbm_write_bytes


def test_hoisted_matmul_reads_rhs_once_per_row_stripe():
    est = estimate(matmul_hoisted, *SPECS, target="trn1")
    # lhsT read once (K*M*2 = 128 KiB); rhs once per 128-row stripe: 2 x K*N*2 = 1 MiB
    assert est.hbm_read_bytes == K * M * 2 + 2 * K * N * 2 == 1_179_648
    # loads: 2 stripes x 2 lhsT tiles + 4 tiles x 2 rhs tiles; stores: 4
    assert est.counts["dma"] == 4 + 8 + 4
    # C is evacuated as fp32 and cast to bf16 by the store DMA: 256 KiB written to HBM
    assert est.hbm_write_bytes == M * N * 2


def test_fully_blocked_matmul_counts():
    est = estimate(matmul_fully_blocked, *SPECS, target="trn1", tiles_m=2, tiles_n=2, tiles_k=2)
    # one block in each dim: rhs and lhsT each read exactly once
    assert est.hbm_read_bytes == K * N * 2 + K * M * 2 == 655_360
    assert est.hbm_write_bytes == M * N * 2
    # loads: 2 rhs + 2 lhsT (one per k tile); stores: 2 (one per 128-row output tile)
    assert est.counts["dma"] == 2 + 2 + 2
    # 2 memsets + one PSUM-to-SBUF accumulate per (n tile, m tile) = 2 x 2
    assert est.counts["vector"] == 2 + 4
    assert est.counts["tensor"] == 2 * 2 * 2  # n tiles x m tiles x k tiles
    assert est.flops == 2 * M * K * N


def test_dma_sweep_moves_exactly_its_bytes():
    src = TensorSpec((128, 4096), "bfloat16")  # 8 KiB per partition
    trace = trace_kernel(dma_sweep, src, 1024, 4, target="trn2")
    # 8 KiB / 1 KiB = 8 loads of [128, 512] bf16, then one [128, 512] store
    assert len(trace) == 9
    assert trace.hbm_read_bytes == 128 * 8192
    assert trace.hbm_write_bytes == 128 * 1024
    loads = [i for i in trace.instrs if i.attrs["dst_space"] == "sbuf"]
    assert {i.attrs["descriptors"] for i in loads} == {128}  # one 1 KiB row per partition
    assert {i.attrs["descriptor_bytes"] for i in loads} == {1024}


@pytest.mark.parametrize("n", [0, 1, 7, 50])
def test_synthetic_trace_has_exactly_n_records(n):
    assert len(synthetic_trace(n)) == n
