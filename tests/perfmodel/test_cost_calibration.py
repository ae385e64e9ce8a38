"""Calibration on small shapes: the four tutorial matmuls rank as published; DMA curve.

The full [4096, 8192] @ [8192, 8192] comparison with the published milliseconds is in
benchmarks/bench_calibration.py (too large for the unit tests).
"""

from __future__ import annotations

from nki_kernels.interp import TensorSpec
from nki_kernels.perfmodel import estimate
from nki_kernels.perfmodel.calibration import MATMULS, PUBLISHED_MS
from nki_kernels.perfmodel.sweep import dma_throughput


def test_the_four_matmuls_rank_in_the_published_order():
    # a quarter of the published problem in each dim that the blocking allows
    m, k, n = 2048, 2048, 2048
    specs = (TensorSpec((k, m), "bfloat16"), TensorSpec((k, n), "bfloat16"))
    order = sorted(PUBLISHED_MS, key=PUBLISHED_MS.__getitem__, reverse=True)
    modeled = [estimate(MATMULS[name], *specs, target="trn1").latency_ns for name in order]
    assert modeled == sorted(modeled, reverse=True)
    assert modeled[0] > 3 * modeled[-1]


def test_dma_efficiency_follows_the_documented_saturation_curve():
    # nki-dma-bandwidth-guide: 256 B - 2 KiB "improving but still below peak", >= 2 KiB
    # "approaches peak", >= 4 KiB "saturates". (v1 matched HARDWARE.md's 10/21/42/81 %,
    # read off an unlabeled plot (L); v2 follows the DMA overview's measured 97 ns per
    # 2 KiB transfer instead, which puts 2 KiB at ~93 %.)
    total = 128 * 1024  # bytes per partition: enough transfers to reach steady state
    ref = dma_throughput("trn2", 32768, total)
    eff = {b: 100 * dma_throughput("trn2", b, total) / ref for b in (256, 512, 1024, 2048, 4096)}
    assert eff[256] < eff[512] < eff[1024] < eff[2048] < 95 < eff[4096]
    assert eff[256] < 25 and eff[2048] > 85
