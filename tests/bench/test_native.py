"""TorchNeuron's native paths (baselines/): routing rules, block counts, exact traffic."""

from __future__ import annotations

import pytest

from nki_kernels.baselines import moe_native, native, norm_steps
from nki_kernels.interp import TensorSpec
from nki_kernels.perfmodel import COST_MODEL_VERSION, estimate

BF16 = "bfloat16"


@pytest.mark.parametrize(
    ("sq", "sk", "d", "mask", "dropout", "route"),
    [
        (2048, 2048, 128, False, 0.0, "aws_flash"),
        (512, 1024, 64, False, 0.0, "aws_flash"),
        (2000, 2048, 128, False, 0.0, "decomposition"),  # seq_q not a multiple of 512
        (2048, 2500, 128, False, 0.0, "decomposition"),  # seq_k not a multiple of 512
        (2048, 2048, 256, False, 0.0, "decomposition"),  # head_dim > 128
        (2048, 2048, 128, True, 0.0, "decomposition"),  # attn_mask tensor
        (2048, 2048, 128, False, 0.1, "decomposition"),  # dropout
    ],
)
def test_sdpa_route_follows_torchneuron_rule(sq, sk, d, mask, dropout, route):
    assert native.sdpa_route(sq, sk, d, attn_mask=mask, dropout_p=dropout) == route


def test_nxd_blockwise_block_count():
    # Mixtral T = 4096, k = 2, E = 8: ceil((8192 - 7) / 512) + 7 = 16 + 7 = 23
    assert moe_native.blockwise_blocks(4096, 8, 2) == 23
    # 64 experts, top-6: ceil((24576 - 63) / 512) + 63 = 48 + 63 = 111
    assert moe_native.blockwise_blocks(4096, 64, 6) == 111
    # T k < E - 1: the first term is clamped at 0
    assert moe_native.blockwise_blocks(1, 64, 6) == 63


def test_blockwise_composition_prices_n_blocks_of_b_rows():
    steps = moe_native.blockwise_fwd(256, 256, 128, 4, 2, BF16, block=128)
    n = moe_native.blockwise_blocks(256, 4, 2, 128)  # ceil((512 - 3) / 128) + 3 = 7
    assert n == 7
    gate_up = [s for s in steps if s.name == "x W_gate_up"]
    assert len(gate_up) == 1 and gate_up[0].repeat == n
    assert gate_up[0].args[0].shape == (256, 128)  # [H, B]


def test_grouped_mm_pads_each_group_to_128_rows():
    steps = moe_native.grouped_mm_fwd(256, 256, 128, 4, BF16, [300, 100, 100, 12])
    sizes = {s.args[0].shape[1]: s.repeat for s in steps if s.name == "x W_gate_up"}
    assert sizes == {384: 1, 128: 3}  # 300 -> 384; 100, 100, 12 -> 128 each
    with pytest.raises(ValueError, match="counts: expected 4"):
        moe_native.grouped_mm_fwd(256, 256, 128, 4, BF16, [1, 2])


def test_capacity_factor_capacity_is_capped_at_the_token_count():
    # ceil(1.25 * 4096 tokens * 2 choices / 8 experts) = 1280
    assert moe_native.moe_capacity(4096, 8, 2, 1.25) == 1280
    assert moe_native.moe_capacity(1, 64, 6, 1.25) == 1
    assert moe_native.moe_capacity(100, 2, 2, 8.0) == 100


def test_fused_norm_pass_reads_x_once_and_writes_y_once():
    n, h = 300, 1000  # odd shape: a ragged last row tile
    e = estimate(
        norm_steps.norm_rows,
        TensorSpec((n, h), BF16),
        None,
        TensorSpec((h,), BF16),
        False,
        BF16,
        target="trn2",
    )
    # x once (n h 2 bytes) + w broadcast to the 128 partitions (128 h 2 bytes)
    assert e.hbm_read_bytes == n * h * 2 + 128 * h * 2
    assert e.hbm_write_bytes == n * h * 2


def test_norm_backward_reduction_pass_has_no_fp32_intermediate_in_hbm():
    n, h = 300, 1000
    x = TensorSpec((n, h), BF16)
    e = estimate(
        norm_steps.norm_bwd_reduce,
        x,
        x,
        TensorSpec((n, 1), "float32"),
        TensorSpec((h,), BF16),
        True,
        target="trn2",
    )
    # dy and x once, rstd once, w broadcast; writes only c [n] and dw, db [h] in fp32
    assert e.hbm_read_bytes == 2 * n * h * 2 + n * 4 + 128 * h * 2
    assert e.hbm_write_bytes == n * 4 + 2 * h * 4


@pytest.mark.parametrize(
    "build",
    [
        lambda: native.rms_norm_fwd(300, 1000, BF16),
        lambda: native.rms_norm_bwd(300, 1000, BF16),
        lambda: native.layer_norm_fwd(300, 1000, BF16),
        lambda: native.layer_norm_bwd(300, 1000, BF16),
        lambda: native.add_rms_norm_fwd(300, 1000, BF16),
        lambda: native.attention_fwd(1, 2, 256, 384, 64, BF16),
        lambda: native.attention_bwd(1, 2, 256, 384, 64, BF16),
        lambda: moe_native.blockwise_fwd(256, 512, 384, 4, 2, BF16),
        lambda: moe_native.grouped_mm_fwd(256, 512, 384, 4, BF16, [200, 100, 100, 112]),
        lambda: moe_native.capacity_factor_fwd(256, 512, 384, 4, 2, BF16),
    ],
)
def test_every_native_composition_traces_and_prices(build):
    est = native.price(build(), "trn2")
    assert est.label == f"modeled (cost model {COST_MODEL_VERSION}, trn2)"
    assert all(ns > 0 for _, ns in est.steps)
    assert est.latency_ns == pytest.approx(sum(ns for _, ns in est.steps))


@pytest.mark.parametrize("centered", [False, True])
def test_fused_norm_pass_computes_the_norm_it_is_priced_as(centered):
    # the native step is priced as the op it stands for: run it with values (fp32) and
    # compare with the definition (LayerNorm with weight and bias, or RMSNorm)
    import numpy as np

    from nki_kernels.interp import run

    rng = np.random.default_rng(0)
    n, h, eps = 200, 384, 1e-5
    x = (rng.standard_normal((n, h)) * 2 + 3).astype(np.float32)
    w = rng.standard_normal(h).astype(np.float32)
    b = rng.standard_normal(h).astype(np.float32) if centered else None
    y = run(norm_steps.norm_rows, x, None, w, centered, "float32", b, eps).outputs
    y = np.asarray(y[0] if isinstance(y, tuple) else y)
    xd = x.astype(np.float64)
    if centered:
        c = xd - xd.mean(1, keepdims=True)
        ref = c / np.sqrt((c**2).mean(1, keepdims=True) + eps) * w + b
    else:
        ref = xd / np.sqrt((xd**2).mean(1, keepdims=True) + eps) * w
    np.testing.assert_allclose(y, ref, rtol=2e-4, atol=2e-4)
