"""Views of the streamed decode body's tiles and of its cache gathers (shared by the
body, `decode_stream.py`, and its FP8 staging, `decode_stream_fp8.py`)."""

from __future__ import annotations

P = 128


def gather(cache, col, layout, hkv_heads, h0, nh, c, d0, dc, v_runs):
    """Indirect view of `c` keys x `nh` heads (from h0) per partition, one partition per
    index in `col`: [n, nh, c, dc] (contiguous / paged_hm) or [n, c, nh, dc] (paged);
    `v_runs` merges each partition's contiguous keys into one trailing dim."""
    n = col.shape[0]
    if layout == "contiguous":
        _, hk, s, d = cache.shape
        flat = cache.reshape((cache.shape[0] * hk * s, d))
        hs, ks, rs = s * d, d, d
    elif layout == "paged_hm":
        nb, hk, bs, d = cache.shape
        flat = cache.reshape((nb * hk * bs, d))
        hs, ks, rs = bs * d, d, d
    else:
        nb, bs, hk, d = cache.shape
        flat = cache.reshape((nb * bs, hk * d))
        hs, ks, rs = d, hk * d, hk * d
    if layout == "paged":
        if v_runs and nh == hk:
            pat = [[rs, n], [1, c * hk * d]]
        elif v_runs:
            pat = [[rs, n], [ks, c], [1, nh * d]]
        else:
            pat = [[rs, n], [ks, c], [hs, nh], [1, dc]]
        off = h0 * hs + d0
    else:
        pat = [[rs, n], [hs, nh], [1, c * d]] if v_runs else [[rs, n], [hs, nh], [ks, c], [1, dc]]
        off = h0 * hs + d0
    return flat.ap(pat, offset=off, vector_offset=col)


def kt_view(b, slot, dci, sl, nh, c, dc):
    """K^T of sequence sl in ring slot `slot`, head_dim chunk dci: [dc, heads, c, 128]
    (each head's keys one contiguous block, whatever the cache layout)."""
    per = nh * c * P
    kt = b["kt"][slot]
    slab = kt.shape[1] // (b["nd"] * P)
    start = (dci * slab + sl * nh * c) * P
    return kt[:dc, start : start + per].reshape((dc, nh, c, P))


def kt_at(b, slot, dci, sl, h, ci, nh, c, n, dc):
    return kt_view(b, slot, dci, sl, nh, c, dc)[:, h, ci, :n]


def v_at(b, slot, sl, h, ci, nh, c, n, d, layout):
    base = sl * nh * c * d
    j = ci * nh + h if layout == "paged" else h * c + ci
    return b["v"][slot][:n, base + j * d : base + (j + 1) * d]


__all__ = ["gather", "kt_at", "kt_view", "v_at"]
