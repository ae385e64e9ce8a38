"""benchmarks/gpu_peers.py imports anywhere, stops cleanly without CUDA, and writes rows
the ledger reads as measured."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from nki_kernels.ledger.gpu import GpuRows
from nki_kernels.ledger.gpu import price_op as gpu_price
from nki_kernels.ledger.layers import Op
from nki_kernels.ledger.models import LLAMA3_8B

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_peers.py"


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("gpu_peers", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_it_stops_with_a_named_error(peers, capsys):
    with pytest.raises(peers.CudaUnavailable, match="is_available"):
        peers.require_cuda()
    assert peers.main(["--model", "llama3-8b", "--phase", "decode"]) == 2
    assert "CudaUnavailable" in capsys.readouterr().err


def test_bad_model_is_a_clean_error(peers, capsys):
    assert peers.main(["--model", "nope"]) == 2
    assert "--model" in capsys.readouterr().err


def test_the_ops_are_the_ledgers(peers):
    model, *ops = peers.ledger_ops("llama3-8b", "train", 1, 8192, 0)
    kinds = {o.kind for o in ops}
    assert model.name == "llama3-8b"
    assert {"matmul", "attention", "norm", "swiglu"} <= kinds


def test_rows_are_read_as_measured(peers, tmp_path):
    base = {
        "device": "GPU X",
        "torch": "9.9",
        "cuda": "99",
        "date": "2026-12-04",
        "method": peers.METHOD.format(reps=10, warmup=3),
        "provenance": "measured (GPU X)",
    }
    rows = [
        peers.make_row(
            base, "gemm", "matmul", "[64, 4096] x [4096, 6144] bf16", (11.0, 10.0, 12.0)
        ),
        peers.make_row(base, "elementwise", "swiglu fwd", "[64, 14336] bf16", (3.0, 2.5, 3.5)),
        peers.make_row(
            base,
            "decode",
            "sdpa decode (1 query)",
            "B=64 Hq=32 Hkv=8 L=4096 D=128 bf16",
            (70.0, 69.0, 71.0),
            hbm_GBps=1000.0,
        ),
    ]
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    g = GpuRows.load(p)
    m = LLAMA3_8B
    f = gpu_price(g, Op("matmuls", "qkv_proj dX", "matmul", (64, 4096, 6144)), m)
    assert f is not None and f.us == 11.0 and f.label == "measured (GPU X, torch 9.9, CUDA 99)"
    f = gpu_price(g, Op("mlp", "silu", "swiglu", (64, 14336, "fwd")), m)
    assert f is not None and f.us == 3.0 and f.kind == "measured"
    f = gpu_price(g, Op("attention", "decode", "decode_attention", (64, 4096, 32, 8, 128)), m)
    assert f is not None and f.us == 70.0 and f.kind == "measured"
    # a shape no row has is derived, and says so
    f = gpu_price(g, Op("attention", "decode", "decode_attention", (64, 8192, 32, 8, 128)), m)
    assert f is not None and f.kind == "derived" and "scaled by K/V bytes" in f.source


def test_decode_moe_streams_the_touched_experts_weights():
    # DeepSeek-V3's 256 experts at a 64-token decode step: uniform routing touches ~222 of
    # them, whose weights (3 x 7168 x 2048 bf16 each) bound the step below, far above
    # what the FLOPs of 64 tokens scaled from a 4096-token row would say
    from nki_kernels.ledger.models import MODELS

    g = GpuRows.load()
    m = MODELS["deepseek-v3-like"]
    fwd = g.moe(m, 64, "fwd")
    touched = 256 * (1 - (1 - 8 / 256) ** 64)
    floor = touched * 3 * 7168 * 2048 * 2 / g.hbm_bytes_per_us()
    assert fwd is not None and fwd.us == pytest.approx(floor)
    assert "HBM bandwidth" in fwd.source and fwd.label.startswith("derived")
    assert g.moe(m, 64, "bwd").us == pytest.approx(2 * floor)
    # a many-token step is still its FLOP scaling (every expert's weights are read anyway)
    big = g.moe(m, 65536, "fwd")
    assert big is not None and "scaled by routed FLOPs" in big.source


def test_absorbed_mla_decode_is_attention_over_the_shared_latent(peers):
    # absorbed MLA = multi-query attention whose one key head is the cache (latent + rope)
    # and whose one value head is its latent part
    torch.manual_seed(0)
    b, h, ctx, lat, rope = 2, 4, 37, 16, 8
    q = torch.randn(b, h, lat + rope)
    cache = torch.randn(b, ctx, lat + rope)
    got = peers.absorbed_mla_decode(torch, q, cache, lat)
    k, v = cache[:, None], cache[:, None, :, :lat]
    want = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)
    torch.testing.assert_close(got, want[:, :, 0])


def test_measured_mla_rows_fill_the_missing_cells(peers, tmp_path):
    from nki_kernels.ledger.layers import Step
    from nki_kernels.ledger.mla import layer_ops as mla_ops
    from nki_kernels.ledger.models import MODELS

    m = MODELS["deepseek-v3-like"]
    base = {"device": "GPU X", "torch": "9.9", "cuda": "99", "provenance": "measured (GPU X)"}
    rows = [
        peers.make_row(base, "attention", "sdpa mla fwd causal",
                       "B=1 H=128 S=4096 D_qk=192 D_v=128 bf16", (900.0, 890.0, 910.0)),
        peers.make_row(base, "decode", "mla decode (absorbed)",
                       "B=64 H=128 L=32768 latent=512+64 bf16", (400.0, 390.0, 410.0),
                       hbm_GBps=4000.0),
    ]  # fmt: skip
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    g = GpuRows.load(p)
    prefill = [o for o in mla_ops(m, Step("prefill", 1, seq=4096)) if o.kind == "mla_attention"]
    decode = [o for o in mla_ops(m, Step("decode", 64, context=32768)) if o.kind == "mla_decode"]
    for op, us in ((prefill[0], 900.0), (decode[0], 400.0)):
        f = gpu_price(g, op, m)
        assert f is not None and f.us == us and f.kind == "measured"
    # another shape has no row and nothing to derive it from: missing, not guessed
    other = mla_ops(m, Step("prefill", 1, seq=8192))
    assert gpu_price(g, next(o for o in other if o.kind == "mla_attention"), m) is None
