"""Property: flash_attention matches a float64 reference for any lengths, heads, masks,
dtype, device and mode, forward and backward; keys past kv_lens never contribute
whatever their value."""

from __future__ import annotations

import references as ref
import torch
from fuzz_support import TOL, assert_rel, count_case, devices, leaf, modes, run
from hypothesis import given
from hypothesis import strategies as st

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)

DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])


@st.composite
def attention_case(draw: st.DrawFn) -> dict:
    b = draw(st.integers(1, 2))
    hkv = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2]))
    segments = draw(st.booleans())
    sq = draw(st.integers(1, 160))
    sk = sq if segments else draw(st.integers(1, 160))
    window = draw(st.one_of(st.none(), st.integers(1, sk + 2)))
    kv_lens = draw(st.one_of(st.none(), st.lists(st.integers(0, sk), min_size=b, max_size=b)))
    seg = None
    if segments:
        # contiguous runs of equal ids per row, ids anywhere in int64
        cuts = draw(st.lists(st.integers(1, max(1, sq - 1)), max_size=4))
        base = draw(st.integers(-(2**62), 2**62))
        row = [base + sum(1 for c in cuts if c <= i) for i in range(sq)]
        seg = torch.tensor([row] * b)
    return {
        "shape": (b, hkv * group, hkv, sq, sk, draw(st.sampled_from([16, 32]))),
        "dtype": draw(DTYPES),
        "causal": draw(st.booleans()),
        "window": window,
        "kv_lens": kv_lens,
        "segment_ids": seg,
        "scale": draw(st.one_of(st.none(), st.floats(0.05, 1.5))),
        "device": draw(devices),
        "mode": draw(modes),
        "backward": draw(st.booleans()),
        "poison": draw(st.sampled_from([None, float("nan"), float("inf")])),
        "seed": draw(st.integers(0, 2**16)),
    }


@given(attention_case())
def test_attention_matches_float64(c: dict) -> None:
    count_case("attention")
    b, hq, hkv, sq, sk, d = c["shape"]
    dt, dev, grad = c["dtype"], c["device"], c["backward"]
    g = torch.Generator().manual_seed(c["seed"])
    q = torch.randn(b, hq, sq, d, generator=g).to(dt)
    k = torch.randn(b, hkv, sk, d, generator=g).to(dt)
    v = torch.randn(b, hkv, sk, d, generator=g).to(dt)
    dout = torch.randn(b, hq, sq, d, generator=g).to(dt)
    kp, vp = k.clone(), v.clone()
    if c["poison"] is not None and c["kv_lens"] is not None:
        for bi, n in enumerate(c["kv_lens"]):
            if n < sk:  # a key no query may attend
                j = int(torch.randint(n, sk, (1,), generator=g))
                kp[bi, :, j, 0] = c["poison"]
                vp[bi, :, j, -1] = c["poison"]
    kv_lens = torch.tensor(c["kv_lens"]) if c["kv_lens"] is not None else None
    seg = c["segment_ids"]
    opts = {"causal": c["causal"], "softmax_scale": c["scale"], "sliding_window": c["window"]}

    def fn(q, k, v, kv_lens, seg):  # type: ignore[no-untyped-def]
        return torch.ops.nki.flash_attention(q, k, v, kv_lens, seg, **opts)[0]

    qs, ks, vs = (leaf(t, dev, grad) for t in (q, kp, vp))
    kl = kv_lens.to(dev) if kv_lens is not None else None
    sg = seg.to(dev) if seg is not None else None
    out = run(fn, c["mode"], qs, ks, vs, kl, sg)
    assert out.device.type == dev and out.dtype == dt
    allowed = ref.attention_allowed(b, sq, sk, c["causal"], c["window"], c["kv_lens"], seg)
    scale = c["scale"] if c["scale"] is not None else d**-0.5
    q64, k64, v64 = (t.to(torch.float64).requires_grad_(grad) for t in (q, k, v))
    want = ref.attention(q64, k64, v64, allowed, scale)
    tol_o, tol_g = TOL[dt]
    assert_rel(out, want, tol_o, "out")
    if not grad:
        return
    out.backward(dout.to(dev))
    want.backward(dout.to(torch.float64))
    m_dq, m_dk = ref.attention_grad_magnitudes(q, k, v, dout, allowed, scale)
    assert_rel(qs.grad, q64.grad, tol_g, "dq", floor=m_dq)
    dead = ~allowed.any(dim=1)  # [B, Sk]: keys no query attends get no gradient
    assert_rel(ks.grad, k64.grad, tol_g, "dk", floor=m_dk)
    assert_rel(vs.grad, v64.grad, tol_g, "dv")
    assert float(ks.grad.detach().cpu().abs()[dead[:, None].expand(-1, hkv, -1)].sum()) == 0.0
