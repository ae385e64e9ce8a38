"""The per-kernel benchmark tables (attention, norms, MoE) print every modeled latency
with its band over the cost model's parameter sets."""

from __future__ import annotations

import json

import pytest

from nki_kernels.attention.bench import markdown_table as attention_markdown
from nki_kernels.attention.bench import price as price_attention
from nki_kernels.model_shapes import AttentionShape, MoEShape
from nki_kernels.moe.pricing import layer_row
from nki_kernels.norm.bench import markdown_table as norm_markdown
from nki_kernels.norm.bench import price as price_norm
from nki_kernels.perfmodel.band import band, parameter_sets

TINY_ATTN = AttentionShape("tiny", num_heads=2, num_kv_heads=1, head_dim=64)


def test_attention_row_band_brackets_the_shipped_figure() -> None:
    row = price_attention("fwd", 512, "trn2", True, shape=TINY_ATTN, bands=True)
    assert row.latency_lo_us is not None and row.latency_hi_us is not None
    assert row.latency_lo_us <= row.latency_us <= row.latency_hi_us
    lo_mfu, hi_mfu = row.mfu_band() or (0.0, 0.0)
    assert lo_mfu <= row.mfu <= hi_mfu
    table = attention_markdown([row])
    assert f"({row.latency_lo_us / 1e3:.2f}–{row.latency_hi_us / 1e3:.2f})" in table
    plain = price_attention("fwd", 512, "trn2", True, shape=TINY_ATTN)
    assert plain.latency_lo_us is None and plain.mfu_band() is None
    assert plain.latency_us == pytest.approx(row.latency_us)


def test_norm_row_band_is_the_trace_scheduled_under_every_parameter_set() -> None:
    from nki_kernels.interp import TensorSpec
    from nki_kernels.norm.rmsnorm import rms_norm_fwd
    from nki_kernels.perfmodel import trace_kernel

    row = price_norm("rms_norm", "fwd", 256, 512, "trn2", bands=True)
    assert row.latency_lo_us is not None and row.latency_hi_us is not None
    assert row.latency_lo_us <= row.latency_us <= row.latency_hi_us
    assert len(parameter_sets("trn2")) > 1
    table = norm_markdown([row], [(256, 512)])
    lat = f"{row.latency_us:.0f} us ({row.latency_lo_us:.0f}–{row.latency_hi_us:.0f} us)"
    assert lat in table
    # the band is perfmodel.band's range of the trace of the row's config
    trace = trace_kernel(
        rms_norm_fwd,
        TensorSpec((256, 512), "bfloat16"),
        TensorSpec((512,), "bfloat16"),
        1e-6,
        target="trn2",
        **json.loads(row.config),
    )
    lo, hi = band(trace, "trn2")
    assert (lo / 1e3, hi / 1e3) == pytest.approx((row.latency_lo_us, row.latency_hi_us))


def test_kernel_tables_label_fractions_above_the_best_published_as_ceilings() -> None:
    # attention MFU above 46 % (attention_cte at S = 16384) and an HBM fraction above
    # 70 % (the perf guide's best DMA utilization) read "ceiling"; below them they do not
    from dataclasses import replace

    attn = price_attention("fwd", 512, "trn2", True, shape=TINY_ATTN)
    high, low = replace(attn, mfu=0.60), replace(attn, mfu=0.40)
    rows = attention_markdown([high, low]).splitlines()[2:]
    assert rows[0].endswith(" | 60.0 ceiling | " + attn.busiest + " |")
    assert "ceiling" not in rows[1]
    norm = price_norm("rms_norm", "fwd", 256, 512, "trn2")
    fast = norm_markdown([replace(norm, hbm_fraction=0.9)], [(256, 512)])
    slow = norm_markdown([replace(norm, hbm_fraction=0.5)], [(256, 512)])
    assert "90.0 % ceiling |" in fast and "ceiling" not in slow
    # a band widened past the HBM bound stops at it (100 % of the bound, never more)
    wide = replace(norm, latency_lo_us=norm.bound_us / 2, latency_hi_us=2 * norm.latency_us)
    assert "–100.0 %)" in norm_markdown([wide], [(256, 512)])


def test_moe_layer_row_band_brackets_the_shipped_figure() -> None:
    shape = MoEShape("tiny", hidden=256, intermediate=512, num_experts=4, top_k=2)
    row = layer_row(shape, 512, "uniform", "trn2", bands=True)
    lo, hi = row["latency_band_ms"]
    assert lo <= row["latency_ms"] <= hi
    assert "latency_band_ms" not in layer_row(shape, 512, "uniform", "trn2")
