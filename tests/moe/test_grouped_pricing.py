"""moe.grouped_pricing: the per-block extrapolation agrees with pricing the whole launch."""

from __future__ import annotations

import numpy as np

from nki_kernels.interp import TensorSpec
from nki_kernels.moe.group_plan import P, plan_row_blocks
from nki_kernels.moe.grouped_gemm import grouped_mm_fwd
from nki_kernels.moe.grouped_pricing import price_grouped_mm, tile_config
from nki_kernels.perfmodel import estimate_trace, trace_kernel
from nki_kernels.targets import get_target


def test_extrapolated_latency_matches_the_whole_launch() -> None:
    counts, k, n = [700, 0, 300, 130, 900], 256, 640
    got = price_grouped_mm(counts, k, n, "trn2")
    m = sum(counts)
    rows, unit_bytes = tile_config(k, n, 2)
    ns = rows // P
    plan = plan_row_blocks(np.cumsum(counts).astype(np.int32), m, rows)
    b = plan.kind_bounds[0]
    kinds = tuple(int(b[j + 1] - b[j]) for j in range(ns + 1))
    nb = plan.slot_rows.shape[0]
    specs = (
        TensorSpec((m, k), "bfloat16"),
        TensorSpec((len(counts), k, n), "bfloat16"),
        TensorSpec((nb, P, ns), "int32"),
        TensorSpec((nb, 1), "int32"),
        TensorSpec((1, ns + 2), "int32"),
    )
    trace = trace_kernel(grouped_mm_fwd, *specs, "kn", unit_bytes, kinds, target="trn2")
    whole = estimate_trace(trace, get_target("trn2")).latency_ns
    # 700 rows: 6 sub-tiles = 2 blocks of 3; 300: 3; 130: 2; 900: 8 = 4 + 4
    assert got.blocks == {4: 2, 3: 3, 2: 1} and got.padded_rows == 19 * P
    assert abs(got.latency_ns[0] - whole) <= 0.03 * whole, (got.latency_ns[0], whole)
