"""DeepSeek's multi-head latent attention priced as it runs: q / k heads 192 wide and v
heads 128 (training, prefill), the absorbed form over the 576-wide latent cache (decode),
the latent projections and their RMSNorms as the compiler's ops; ours falls back to the
native path and says so; the GPU column marks what no measured row covers."""

from __future__ import annotations

import pytest

from nki_kernels.baselines import native
from nki_kernels.ledger.gpu import MISSING, GpuRows
from nki_kernels.ledger.layers import Step, layer_ops
from nki_kernels.ledger.ledger import build
from nki_kernels.ledger.mla import attention_steps, decode_steps
from nki_kernels.ledger.models import MODELS, ModelSpec
from nki_kernels.ledger.prices import load_instances
from nki_kernels.ledger.report import ledger_text
from nki_kernels.ledger.store import RowStore

DSV3 = MODELS["deepseek-v3-like"]
# a DeepSeek-shaped toy: every width small, so pricing it is quick
TINY = ModelSpec(
    "tiny-mla",
    layers=2,
    hidden=256,
    heads=4,
    kv_heads=4,
    head_dim=32,
    vocab=512,
    experts=0,
    intermediate=512,
    q_lora_rank=64,
    kv_lora_rank=64,
    qk_rope_dim=16,
    qk_nope_dim=48,
)


def _ops(model: ModelSpec, step: Step) -> dict[str, tuple]:
    return {o.name: (o.kind, o.args, o.count) for o in layer_ops(model, step, moe=False)}


def test_training_runs_192_wide_scores_and_128_wide_values():
    ops = _ops(DSV3, Step("train", 1, seq=4096))
    fwd = ops["MLA attention fwd (causal, q/k 192, v 128)"]
    bwd = ops["MLA attention bwd (causal, q/k 192, v 128)"]
    assert fwd[:2] == ("mla_attention", ("fwd", 4096, 1, 128, 192, 128))
    assert bwd[:2] == ("mla_attention", ("bwd", 4096, 1, 128, 192, 128))
    # the latent projections and their norms, forward and backward
    assert ops["q_a_proj fwd"][1] == (4096, 7168, 1536)
    assert ops["kv_a_proj fwd"][1] == (4096, 7168, 512 + 64)
    assert ops["kv_b_proj dW"][1] == (512, 4096, 128 * (128 + 128))
    assert ops["q_a_layernorm rms_norm bwd"][1] == ("rms_norm", "bwd", 4096, 1536)
    assert ops["kv_a_layernorm rms_norm fwd"][1] == ("rms_norm", "fwd", 4096, 512)
    assert not any(k == "attention" for k, _, _ in ops.values())  # no MHA stand-in left


def test_decode_is_the_absorbed_form_over_the_latent_cache():
    ops = _ops(DSV3, Step("decode", 64, context=32768))
    assert ops["absorbed MLA decode (latent 512 + rope 64)"][:2] == (
        "mla_decode",
        (64, 32768, 128, 512, 64),
    )
    # kv_b_proj is folded into the query and the output, once per head
    assert ops["q absorb (kv_b key half) fwd"] == ("matmul", (64, 128, 512), 128)
    assert ops["out absorb (kv_b value half) fwd"] == ("matmul", (64, 512, 128), 128)
    assert not any(name.startswith("kv_b_proj") for name in ops)


def test_the_score_product_is_the_rotary_width_wider():
    # same heads, S and v width: widening q / k by 64 adds exactly 2 S^2 x 64 FLOPs per
    # head to the forward, and twice that (dQ and dK) to the backward
    s, h = 512, 2

    def flops(kind: str, d_qk: int) -> float:
        return native.price(attention_steps(kind, h, s, d_qk, 128), "trn2").flops

    assert flops("fwd", 192) - flops("fwd", 128) == pytest.approx(h * 2 * s * s * 64)
    assert flops("bwd", 192) - flops("bwd", 128) == pytest.approx(h * 2 * 2 * s * s * 64)


def test_absorbed_decode_reads_one_latent_for_every_head():
    # the scores and the output both run over the latent: halving it removes 2 x 2 H L x 256
    h, ctx = 16, 1024
    big = native.price(decode_steps(h, ctx, 512, 64), "trn2").flops
    small = native.price(decode_steps(h, ctx, 256, 64), "trn2").flops
    assert big - small == pytest.approx(2 * 2 * h * ctx * 256)


def test_ours_falls_back_to_native_and_the_gpu_decode_says_missing(tmp_path):
    store = RowStore(cache=tmp_path / "rows.jsonl")
    led = build(TINY, Step("decode", 4, context=1024), "trn2", 2, store, GpuRows.load())
    mla = [o for o in led.ops if o.op.kind in MISSING]
    assert mla
    for o in mla:
        ours, nat = o.figs["ours"], o.figs["native"]
        assert ours is not None and nat is not None and ours.us == nat.us > 0
        assert "model's torch code runs" in ours.source
        assert o.figs["gpu"] is None
    out = ledger_text(led, *(load_instances()[0][n] for n in ("trn2.48xlarge", "p5en.48xlarge")))
    assert "GPU column MISSING" in out and "(partial)" in out and "LOWER BOUND" in out
    assert "MISSING (not measured)" in out


def test_gpu_mla_attention_is_derived_from_the_sdpa_rows_by_flops(tmp_path):
    store = RowStore(cache=tmp_path / "rows.jsonl")
    led = build(TINY, Step("train", 1, seq=512), "trn2", 2, store, GpuRows.load())
    mla = [o for o in led.ops if o.op.kind == "mla_attention"]
    assert len(mla) == 2
    for o in mla:
        assert "falls back" in o.figs["ours"].source
        g = o.figs["gpu"]
        assert g is not None and g.kind == "derived" and "by FLOPs" in g.source
    out = ledger_text(led, *(load_instances()[0][n] for n in ("trn2.48xlarge", "p5en.48xlarge")))
    assert "MISSING" not in out and "(partial)" not in out


@pytest.mark.parametrize(
    "kind, dims", [("fwd", (192 + 128) / 256), ("bwd", (3 * 192 + 2 * 128) / 640)]
)
def test_gpu_mla_derivation_scales_the_faster_causal_row(kind, dims):
    g = GpuRows.load()
    rows = g.find(f"sdpa {kind} causal", "B=1 H=32/8 S=8192 D=128 bf16")
    fastest = min(r["latency_us"] for r in rows)
    f = g.mla_attention(kind, 8192, 2, 128, 192, 128)
    assert f is not None and f.label.startswith("derived from measured rows")
    assert f.us == pytest.approx(fastest * 128 / 32 * dims * 2)
