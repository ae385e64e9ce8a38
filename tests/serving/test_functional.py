"""nki_kernels.serving.functional in vLLM-Neuron's conventions (q [Nh, T, Dh], caches
[num_blocks, Hkv, block_size, Dh], prior_tokens [[cached]], sink [Nh, 1], out
[Nh, Dh, T]) against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from _steps import TOLERANCES, assert_rel_close, make_step, record_launches

import nki_kernels.serving.functional as NF
from nki_kernels.serving.reference import reference_serving_attention


@pytest.mark.parametrize("tp_out", [True, False])
def test_segmented_prefill_chunk(tp_out: bool) -> None:
    """One sequence: a 24-token chunk after 40 cached tokens, written by the model through
    write_kv_cache, then attended (GPT-OSS style: sinks + sliding window)."""
    step = make_step([(40, 24)], layout="hnd", pad_tokens=0, seed=13)
    nh, bs = 4, 16
    sinks = torch.randn(nh, generator=torch.Generator().manual_seed(0))
    kc, vc = step.k_cache.clone(), step.v_cache.clone()
    NF.write_kv_cache(step.k.transpose(0, 1), step.v.transpose(0, 1), kc, vc,
                      step.slot_mapping, bs)  # fmt: skip
    out = NF.segmented_attention(
        step.q.transpose(0, 1), k_cache=kc, v_cache=vc, block_tables=step.block_table,
        prior_tokens=step.cached_seq_len.reshape(1, 1).int(), block_size=bs,
        kv_segment_size=512, scale=0.15, sliding_window=17, sink=sinks.unsqueeze(1),
        tp_q=True, tp_out=tp_out,
    )  # fmt: skip
    ref, rk, _ = reference_serving_attention(
        *step.args(), softmax_scale=0.15, sliding_window=17, sinks=sinks, layout="hnd"
    )
    expect = ref.transpose(0, 1)  # [Nh, T, Dh]
    if tp_out:
        expect = expect.transpose(1, 2)
    assert tuple(out.shape) == tuple(expect.shape)
    assert_rel_close(out, expect, TOLERANCES[torch.float32])
    assert torch.equal(kc.isnan(), rk.isnan()) and torch.equal(kc.nan_to_num(), rk.nan_to_num())


def test_functional_errors() -> None:
    step = make_step([(3, 4)], layout="hnd", pad_tokens=0)
    q = step.q.transpose(0, 1)
    with pytest.raises(ValueError, match="block_size: expected 16"):
        NF.segmented_attention(q, step.k_cache, step.v_cache, step.block_table,
                               step.cached_seq_len.reshape(1, 1), 32)  # fmt: skip
    with pytest.raises(ValueError, match="fp8_packed: expected False"):
        NF.segmented_attention(q, step.k_cache, step.v_cache, step.block_table,
                               step.cached_seq_len.reshape(1, 1), 16, fp8_packed=True)  # fmt: skip


def _attend64(q, k, v, scale, causal, window=None, sinks=None):  # type: ignore[no-untyped-def]
    """float64 attention of q [H, S, D] over k, v [H, S_k, D] (bottom-right causal)."""
    q, k, v = q.double(), k.double(), v.double()
    s = torch.einsum("hqd,hkd->hqk", q, k) * scale
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    allowed = (j <= i) if causal or window else torch.ones(sq, sk, dtype=torch.bool)
    if window:
        allowed &= j > i - window
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double().reshape(-1, 1, 1).expand(-1, sq, 1)], -1)
    p = torch.softmax(s, -1)[..., :sk]
    return p @ v


@pytest.mark.parametrize(("tp_q", "tp_k", "tp_out"), [(True, False, False), (False, True, True)])
@pytest.mark.parametrize("gpt_oss", [False, True], ids=["plain", "sink-window"])
def test_flash_attention_attention_cte_layouts(tp_q: bool, tp_k: bool, tp_out: bool,
                                               gpt_oss: bool) -> None:  # fmt: skip
    """attention_cte's layouts: heads folded into the batch (4 query heads on 2 KV heads,
    query b on KV b // 2), q [B, S, D] or [B, D, S], k [B_kv, D, S] or [B_kv, S, D]."""
    g = torch.Generator().manual_seed(3)
    b, b_kv, s, d = 4, 2, 37, 32
    q, k, v = (torch.randn(n, s, d, generator=g) for n in (b, b_kv, b_kv))
    sink = torch.randn(b, 1, generator=g) if gpt_oss else None
    window = 9 if gpt_oss else None
    out = NF.flash_attention(q if tp_q else q.transpose(1, 2), k if tp_k else k.transpose(1, 2),
                             v, scale=0.2, causal_mask=True, sink=sink, sliding_window=window,
                             tp_q=tp_q, tp_k=tp_k, tp_out=tp_out)  # fmt: skip
    kk, vv = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
    ref = _attend64(q, kk, vv, 0.2, True, window, None if sink is None else sink.reshape(-1))
    assert_rel_close(out.transpose(1, 2) if tp_out else out, ref, TOLERANCES[torch.float32])


def _decode_case(fp8: bool):  # type: ignore[no-untyped-def]
    """Two sequences (7 and 20 cached tokens) of 2 new tokens each, a hnd paged cache."""
    g = torch.Generator().manual_seed(4)
    b, s_tkg, hidden, hq, hkv, d, bs = 2, 2, 48, 4, 2, 16, 8
    cdt = torch.float8_e4m3fn if fp8 else torch.float32
    ctx = torch.tensor([7, 20])
    table = torch.tensor([[5, 2, 0, 0], [1, 6, 3, 4]], dtype=torch.int32)
    kc = (torch.randn(8, hkv, bs, d, generator=g) * 0.5).to(cdt)
    vc = (torch.randn(8, hkv, bs, d, generator=g) * 0.5).to(cdt)
    slots = torch.tensor([[int(table[i, p // bs]) * bs + p % bs for p in (c, c + 1)]
                          for i, c in enumerate(ctx.tolist())]).reshape(-1)  # fmt: skip
    x = torch.randn(b, s_tkg, hidden, generator=g)
    w_qkv = torch.randn(hidden, d * (hq + 2 * hkv), generator=g) / hidden**0.5
    w_out = torch.randn(hq * d, hidden, generator=g) / (hq * d) ** 0.5
    ang = torch.rand(d // 2, b, s_tkg, generator=g) * 3
    return x, w_qkv, w_out, kc, vc, table, ctx, slots, ang.cos(), ang.sin(), (hq, hkv, d)


def _rope64(x, cos, sin):  # type: ignore[no-untyped-def]
    c, s = cos.permute(1, 2, 0).unsqueeze(2).double(), sin.permute(1, 2, 0).unsqueeze(2).double()
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


@pytest.mark.parametrize("fp8", [False, True], ids=["fp32-cache", "fp8-cache"])
def test_attention_decode_block(fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Projection, RoPE (contiguous halves), cache write, attention with sinks, output
    projection, against float64 torch; FP8 in the plugin's convention (the cache holds
    x * k_scale; softmax_scale and W_out carry the dequantization). The write and the
    attention are one launch of the decode-step kernel, fp8 included."""
    launched = record_launches(monkeypatch)
    x, w_qkv, w_out, kc, vc, table, ctx, slots, cos, sin, (hq, hkv, d) = _decode_case(fp8)
    sink = torch.tensor([[0.5], [-1.0], [2.0], [0.0]])
    scaling = d**-0.5
    kw = {}
    ks = vs = 1.0
    if fp8:
        ks, vs = 4.0, 2.0  # multipliers (reciprocals of the checkpoint's scales)
        kw = {"k_scale": torch.tensor([[ks]]), "v_scale": torch.tensor([[vs]])}
    k_cache, v_cache = kc.clone(), vc.clone()
    y = NF.attention_decode(
        x, W_qkv=w_qkv, K_cache=k_cache, V_cache=v_cache, block_tables=table,
        cached_seq_len=ctx, slot_mapping=slots, q_heads=hq, cos=cos, sin=sin, sink=sink,
        W_out=w_out / vs, softmax_scale=scaling / ks, **kw,
    )  # fmt: skip
    # float64 reference: the same block, attending over the dequantized cache
    qkv = x.double() @ w_qkv.double()
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], -1)
    q = _rope64(q.reshape(2, 2, hq, d), cos, sin)
    k = _rope64(k.reshape(2, 2, hkv, d), cos, sin)
    v = v.reshape(2, 2, hkv, d)
    kq, vq = (k * ks).to(kc.dtype).double() / ks, (v * vs).to(kc.dtype).double() / vs
    outs = []
    for i, c in enumerate(ctx.tolist()):
        rows = torch.arange(c)
        blocks, offs = table[i, rows // 8].long(), rows % 8
        kk = torch.cat([kc[blocks, :, offs].double() / ks, kq[i]])  # [c + 2, Hkv, D]
        vv = torch.cat([vc[blocks, :, offs].double() / vs, vq[i]])
        kk, vv = kk.repeat_interleave(hq // hkv, 1), vv.repeat_interleave(hq // hkv, 1)
        o = _attend64(q[i].transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1), scaling,
                      True, sinks=sink.reshape(-1))  # fmt: skip
        outs.append(o.transpose(0, 1).reshape(2, hq * d))
    ref = torch.stack(outs) @ w_out.double()
    assert launched == ["serving_decode_fwd"]
    assert_rel_close(y, ref, TOLERANCES[torch.float32])
    written = k_cache[table[0, 0], :, 7].double() / ks  # sequence 0's first new token
    assert_rel_close(written, kq[0, 0], 1e-6, "k_cache")


@pytest.mark.parametrize(
    ("scales", "match"),
    [({"k_scale": torch.tensor([4.0])}, "k_scale / v_scale: expected both"),
     ({"k_scale": torch.tensor([4.0, 4.0]), "v_scale": torch.tensor([2.0])},
      r"k_scale: expected one value \(per tensor\); got shape \(2,\)")],
)  # fmt: skip
def test_attention_decode_fp8_scales_are_checked(scales: dict, match: str) -> None:
    """A lone scale, or per-head scales the scalar softmax_scale / W_out cannot carry,
    are refused before anything is written."""
    x, w_qkv, _, kc, vc, table, ctx, slots, cos, sin, (hq, _, _) = _decode_case(True)
    k_cache, v_cache = kc.clone(), vc.clone()
    with pytest.raises(ValueError, match=match):
        NF.attention_decode(
            x, W_qkv=w_qkv, K_cache=k_cache, V_cache=v_cache, block_tables=table,
            cached_seq_len=ctx, slot_mapping=slots, q_heads=hq, cos=cos, sin=sin, **scales,
        )  # fmt: skip
    assert torch.equal(k_cache.view(torch.uint8), kc.view(torch.uint8))
