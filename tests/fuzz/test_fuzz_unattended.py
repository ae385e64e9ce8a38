"""Property: NaN / Inf planted at keys no query can see changes nothing (issue 31), for
every non-decode attention entry point (flash_attention with kv_lens, dense bool and
additive masks, per-head masks; flash_attention_varlen; flex_attention; sdpa): outputs
and gradients are bit-identical to the clean run and the planted keys' dK / dV are 0."""

from __future__ import annotations

import torch
from fuzz_support import count_case, devices
from hypothesis import given
from hypothesis import strategies as st

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)
from nki_kernels.attention import flex
from nki_kernels.ops.attention import flash_attention_varlen, flex_attention, sdpa

ENTRIES = ("kv_lens", "dense_bool", "dense_additive", "per_head", "varlen", "flex", "sdpa")


@st.composite
def unattended_case(draw: st.DrawFn) -> dict:
    return {
        "entry": draw(st.sampled_from(ENTRIES)),
        "sq": draw(st.integers(1, 150)),
        "sk": draw(st.integers(2, 150)),
        "hkv": draw(st.integers(1, 2)),
        "group": draw(st.sampled_from([1, 2])),
        "causal": draw(st.booleans()),
        "dtype": draw(st.sampled_from([torch.float32, torch.bfloat16])),
        "device": draw(devices),
        "poison": draw(st.sampled_from([float("nan"), float("inf"), -float("inf")])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _dense_allowed(c: dict, g: torch.Generator, per_head: bool) -> torch.Tensor:
    """bool [1, H | 1, Sq, Sk]: random rows with some keys no query (of a head) attends."""
    h = c["hkv"] * c["group"] if per_head else 1
    allowed = torch.rand(1, h, c["sq"], c["sk"], generator=g) < 0.7
    dead = torch.rand(1, h, 1, c["sk"], generator=g) < 0.3
    return allowed & ~dead


def _case(c: dict, g: torch.Generator):  # type: ignore[no-untyped-def]
    """(fn(q, k, v), q, k, v, dead) where dead is bool over k's [.., S, ..] positions: the
    key rows (per KV head) no query attends."""
    e, sq, sk, hkv, grp = c["entry"], c["sq"], c["sk"], c["hkv"], c["group"]
    hq, d = hkv * grp, 16
    if e == "varlen":
        docs = int(torch.randint(1, 5, (1,), generator=g))
        lq = torch.randint(0, 6, (docs,), generator=g)
        lk = torch.randint(1, 6, (docs,), generator=g)
        lq[0] = max(int(lq[0]), 1)  # at least one query somewhere
        cq = torch.cat([torch.zeros(1, dtype=torch.int64), lq.cumsum(0)]).to(torch.int32)
        ck = torch.cat([torch.zeros(1, dtype=torch.int64), lk.cumsum(0)]).to(torch.int32)
        q = torch.randn(int(cq[-1]), hq, d, generator=g)
        k, v = (torch.randn(int(ck[-1]), hkv, d, generator=g) for _ in range(2))
        dq = torch.repeat_interleave(torch.arange(docs), lq)
        dk = torch.repeat_interleave(torch.arange(docs), lk)
        seen = (dq[:, None] == dk[None, :]).any(0)  # keys of documents with queries
        dead = ~seen[:, None].expand(-1, hkv)

        def fn(q, k, v):  # type: ignore[no-untyped-def]
            mq, mk = int(lq.max()), int(lk.max())
            cqd, ckd = cq.to(q.device), ck.to(q.device)
            return flash_attention_varlen(q, k, v, cqd, ckd, mq, mk, causal=c["causal"])

        return fn, q, k, v, dead
    q = torch.randn(1, hq, sq, d, generator=g)
    k, v = (torch.randn(1, hkv, sk, d, generator=g) for _ in range(2))
    if e == "kv_lens":
        n = int(torch.randint(0, sk, (1,), generator=g))
        dead = (torch.arange(sk) >= n)[None, None, :].expand(1, hkv, sk)

        def fn(q, k, v):  # type: ignore[no-untyped-def]
            kl = torch.tensor([n], device=q.device)
            return torch.ops.nki.flash_attention(q, k, v, kv_lens=kl, causal=c["causal"])[0]

        return fn, q, k, v, dead
    allowed = _dense_allowed(c, g, per_head=e in ("per_head", "flex"))
    seen = allowed.any(2)  # [1, H | 1, Sk]
    if seen.shape[1] > 1:
        seen = seen.reshape(1, hkv, grp, sk).any(2)
    dead = ~seen.expand(1, hkv, sk)
    if e == "flex":
        bm = flex.create_block_mask(lambda b, h, i, j: allowed[0, h, i, j], 1, hq, sq, sk)

        def fn(q, k, v):  # type: ignore[no-untyped-def]
            return flex_attention(q, k, v, block_mask=bm, enable_gqa=True)

        return fn, q, k, v, dead
    mask: torch.Tensor = allowed
    if e == "dense_additive":
        bias = 0.5 * torch.randn(allowed.shape, generator=g)
        mask = bias.masked_fill(~allowed, -float("inf"))

    def fn(q, k, v):  # type: ignore[no-untyped-def]
        m = mask.to(q.device) if mask.dtype == torch.bool else mask.to(q.device, q.dtype)
        if e == "sdpa":
            return sdpa(q, k, v, attn_mask=m, enable_gqa=True)
        return torch.ops.nki.flash_attention(q, k, v, attn_mask=m)[0]

    return fn, q, k, v, dead


def _run(fn, q, k, v, dout):  # type: ignore[no-untyped-def]
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


@given(unattended_case())
def test_nonfinite_keys_no_query_can_see_change_nothing(c: dict) -> None:
    count_case("unattended")
    g = torch.Generator().manual_seed(c["seed"])
    fn, q, k, v, dead = _case(c, g)
    varlen = c["entry"] == "varlen"
    dev, dt = c["device"], c["dtype"]
    q, k, v = (t.to(dev, dt) for t in (q, k, v))
    # the key positions to poison: [S, Hkv] for varlen, [1, Hkv, S] otherwise
    pick = dead & (torch.rand(dead.shape, generator=g) < 0.5)
    if not bool(pick.any()):
        pick = dead.clone()
    sel = pick.to(dev)[..., None]
    kp = k.masked_fill(sel, c["poison"])
    vp = v.masked_fill(sel, c["poison"])
    dout = torch.randn(q.shape, generator=g).to(dev, dt)
    clean = _run(fn, q, k, v, dout)
    got = _run(fn, q, kp, vp, dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, clean):
        keep = ~sel.expand_as(a) if name in ("dk", "dv") else torch.ones_like(a, dtype=torch.bool)
        assert bool(torch.isfinite(a[keep]).all()), f"{name}: non-finite ({c['entry']})"
        assert torch.equal(a[keep], b[keep]), f"{name} differs from the clean run ({c['entry']})"
        if name in ("dk", "dv"):
            assert bool((a[~keep] == 0).all()), f"{name} of a planted key is not 0"
    assert varlen or got[0].shape == q.shape
