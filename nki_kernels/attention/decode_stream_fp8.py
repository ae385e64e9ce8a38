"""FP8 KV caches in the streamed decode body (`decode_stream.py`): K and V are gathered
as they lie (one byte per element: half a bf16 cache's HBM bytes, the same row gathers
as V's), then, per slab and one slab ahead of its score matmuls:

    V rows -> compute dtype                          GpSimd (tensor_copy)
    K rows -> compute dtype, per unit of keys        VectorE (tensor_copy)
              (a head's C keys in hnd; 4 keys x all heads in nhd: one contiguous run)
    K^T    =  PE transposes of the converted rows    TensorE, a PSUM bank per group
              evacuated x k_mult[head] (softmax_scale * k_scale)   ScalarE (activation)
    out    =  O / l x v_mult[column] (v_scale, in `_finish_item`)

The conversions are the segmented kernel's (fp8 -> compute dtype on VectorE / GpSimd,
exact: every e4m3fn / e5m2 value is a bf16, fp16 (e4m3fn) and fp32 value); the body's
softmax then runs with scale 1 on logits that already carry softmax_scale * k_scale
(K x k_mult rounded once to the compute dtype, as a dequantized cache would be).

Why PE transposes of the converted rows, not DMA transposes (the 2-byte transposes the
bf16 body gathers K^T with) of them, SBUF -> SBUF: the cost model prices an SBUF -> SBUF
DMA transpose at 0.41 of the DMA copy rate (trn2), so K would cost the DMA queues the
fp8 gather plus ~2.2x a bf16 K^T gather, on queues that already bound the bf16 body;
TensorE has room (a 128 x 128 transpose is 128 cycles) and ScalarE, nearly idle in the
bf16 body, takes the evacuation. Trainium2's matmul does not take float8_e4m3fn (OCP
e4m3, vLLM's fp8 cache) as an operand, so neither K nor V can skip the conversion.
"""

from __future__ import annotations

from ..nki import nisa, nl
from .decode_stream_views import kt_view

P = 128
FP8 = (nl.float8_e4m3, nl.float8_e5m2, nl.float8_e4m3fn)
UNIT_KEYS = 4  # nhd: keys of a piece converted per unit (x all heads: one run)
PSUM_BYTES = 2048  # one PSUM bank per partition: a group of transposes


def is_fp8(dtype) -> bool:
    return dtype in FP8


def fp8_buffers(b, cache_dt, cdt, d, piece, nsq, nhm, ring, hkv, layout):
    """The FP8 staging tiles: raw K / V rings in the cache dtype (V's layout for both),
    two slots of converted K rows, two PSUM transpose banks, k_mult on every partition."""
    f32, sb = nl.float32, nl.sbuf
    slab = nsq * nhm * piece
    b["kraw"] = [nl.ndarray((P, slab * d), dtype=cache_dt, buffer=sb) for _ in range(ring)]
    b["vraw"] = [nl.ndarray((P, slab * d), dtype=cache_dt, buffer=sb) for _ in range(ring)]
    unit = max(piece, UNIT_KEYS * nhm) * d if layout == "paged" else piece * d
    b["krow"] = [nl.ndarray((P, unit), dtype=cdt, buffer=sb) for _ in range(2)]
    width = PSUM_BYTES // (4 if cdt == nl.float32 else 2)
    b["tk_ps"] = [nl.ndarray((P, width), dtype=cdt, buffer=nl.psum) for _ in range(2)]
    b["kmul"] = nl.ndarray((P, hkv), dtype=f32, buffer=sb)
    b["vmul"] = [nl.ndarray((P, 1), dtype=f32, buffer=sb) for _ in range(ring + 1)]
    b["tgroup"] = width // P


def load_k_mult(b, k_mult):
    """k_mult [1, Hkv] on every partition (the evacuations' per-head scale)."""
    nisa.dma_copy(dst=b["kmul"], src=k_mult.broadcast(0, P))


def _geometry(io, step):
    t, _, j, _, _, _ = step
    _b0, ns, h0, nh = io["tiles"][t]
    c, n = (io["piece"], P) if j >= 0 else (1, io["piece"])
    return ns, h0, nh, c, n


def convert_v(io, b, step, slot):
    """Slab `step`'s V (slot `slot` of v) in the compute dtype from the raw fp8 rows."""
    ns, _h0, nh, c, n = _geometry(io, step)
    width = ns * nh * c * io["d"]
    nisa.tensor_copy(dst=b["v"][slot][:n, :width], src=b["vraw"][slot][:n, :width],
                     engine=nisa.engine.gpsimd)  # fmt: skip


def convert_k(io, b, step, slot):
    """Slab `step`'s K^T (ring slot `slot` of kt) in the compute dtype from the raw fp8
    rows, scaled by k_mult (see the module docstring)."""
    ns, h0, nh, c, n = _geometry(io, step)
    d, nd, layout = io["d"], io["nd"], io["layout"]
    raw, kmul = b["kraw"][slot], b["kmul"]
    paged = layout == "paged"
    uk = min(UNIT_KEYS, c) if paged else c  # keys per unit
    units = [(ci0, h) for ci0 in range(0, c, uk) for h in ([0] if paged else range(nh))]
    gmax = b["tgroup"]
    for sl in range(ns):
        base = sl * nh * c * d
        for u, (ci0, hu) in enumerate(units):
            run = (uk * nh if paged else c) * d
            off = base + (ci0 * nh * d if paged else hu * c * d)
            krow = b["krow"][(sl * len(units) + u) % 2]
            nisa.tensor_copy(
                dst=krow[:n, :run], src=raw[:n, off : off + run], engine=nisa.engine.vector
            )
            for h in range(nh) if paged else [hu]:
                for dci in range(nd):
                    d0, dc = dci * P, min(P, d - dci * P)
                    kv = kt_view(b, slot, dci, sl, nh, c, dc)
                    for g0 in range(ci0, ci0 + uk, gmax):
                        grp = list(range(g0, min(ci0 + uk, g0 + gmax)))
                        tp = b["tk_ps"][(g0 // gmax + dci + h) % 2]
                        for x, ci in enumerate(grp):
                            col = ((ci - ci0) * nh + h) * d if paged else ci * d
                            nisa.nc_transpose(
                                dst=tp[:dc, x * P : x * P + n],
                                data=krow[:n, col + d0 : col + d0 + dc],
                            )
                        g = len(grp)
                        src = tp[:dc, : g * P].reshape((dc, g, P))[:, :, :n]
                        nisa.activation(
                            dst=kv[:, h, grp[0] : grp[0] + g, :n], op=nl.copy, data=src,
                            scale=kmul[:dc, h0 + h : h0 + h + 1],
                        )  # fmt: skip


__all__ = ["FP8", "convert_k", "convert_v", "fp8_buffers", "is_fp8", "load_k_mult"]
