"""Decode MoE kernel: a whole SwiGLU expert layer for T <= 64 tokens in one launch, built
for the weight-streaming bound of decode.

    out[t] = sum_j weights[t, j] * (silu(x_t W_gate[e]) * (x_t W_up[e])) W_down[e],  e = ids[t, j]

At decode sizes every touched expert sees a handful of tokens, so the layer is bound by
reading the touched experts' weights once; the kernel keeps TensorE, VectorE and ScalarE
work per weight byte small enough to hide under that stream:

- Weights are the *stationary* operand and the tokens the moving one (N = T columns): a
  matmul costs max(T, 64) cycles per [<=128, <=128] weight tile (half of what 512-wide
  moving weight tiles cost per byte), and its result is the transposed activation
  [columns of W, T], which is exactly the next matmul's moving operand: no per-expert
  gather, no per-expert PE transposes. x^T is built once per launch.
- Every touched expert runs on all T tokens (a matmul costs the same for 1..64 moving
  columns); its non-routed tokens are selected out of the activation (a predicated copy
  of 0, never a multiply), so a NaN / Inf of another token never reaches them, and its
  routed tokens are scaled by their routing weight after the down projection. The
  weighted combine is a running fp32 sum over the experts in SBUF, one rounding at the end.
- A contraction dim D (hidden H for gate/up, intermediate I for down) is cut into tiles of
  pk = the largest divisor of D <= 128 rows (tile j = rows j*pk .. j*pk + pk - 1; all
  tiles full, e.g. 120 x 24 for 2880): weight units are [pk, kc tiles, columns], each
  partition reading kc runs of whole rows (or column groups of >= 4 KiB), W_BUFS units in
  flight across expert boundaries (the buffers are renamed per unit).
- LNC 2: the programs take alternate touched experts (`experts` lists them first), each
  keeping a partial fp32 sum; after a core barrier on the shared partials each program
  finishes half of the output columns.

Inputs: hidden [T, H]; w_gate_up [E, H, 2I] (gate columns then up); w_down [E, I, H];
ids [T, k] int32; weights [T, k] fp32; experts [1, E] int32 (the touched experts first);
n_touched [1, 1] int32. `static_count` (pricing): the touched count, run as a static loop
of the same body. Output [T, H] in hidden's dtype.
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nki, nl
from .tiles import PSUM_FP32, P, cdiv

UNIT_BYTES = 16 * 1024  # bytes per partition of one weight unit (2 MiB per load)
W_BUFS = 3  # weight units in flight
GU_BANKS = 3  # PSUM banks of the gate and of the up accumulators of one column group
DOWN_BANKS = 2  # PSUM banks of the down projection's accumulators (8 banks in all)


def tile_split(d: int) -> tuple[int, int]:
    """(pk, tiles): rows per contraction tile = the largest divisor of d that is <= 128."""
    pk = min(d, P)
    while d % pk:
        pk -= 1
    return pk, d // pk


def token_slot(t: int) -> int:
    """PSUM columns per token tile: the next power of two >= T, so no tile straddles a bank."""
    s = 1
    while s < t:
        s *= 2
    return s


def _program() -> tuple[int, int]:
    if nl.program_ndim() == 0 or nl.num_programs(0) == 1:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


@nki.jit
def moe_decode_fwd(hidden, w_gate_up, w_down, ids, weights, experts, n_touched, static_count=None):
    """out [T, H] = the decode MoE layer (module docstring)."""
    t_count, h = hidden.shape
    e_count, _, i2 = w_gate_up.shape
    inter = i2 // 2
    k = ids.shape[1]
    assert w_down.shape == (e_count, inter, h), "moe_decode_fwd: w_down is [E, I, H]"
    assert t_count <= PSUM_FP32 // 8, "moe_decode_fwd: T <= 64"
    dt = hidden.dtype
    pid, nprog = _program()
    pkh, kth = tile_split(h)
    pki, kti = tile_split(inter)
    ts = token_slot(t_count)
    d = {"T": t_count, "H": h, "I": inter, "E": e_count, "k": k, "dt": dt, "TS": ts}
    d.update(pkh=pkh, kth=kth, pki=pki, kti=kti, isz=dtype_bytes(dt))
    out = nl.ndarray((t_count, h), dtype=dt, buffer=nl.shared_hbm)

    # x^T [pkh, kth, T] once: PE transposes of x's column tiles
    x_sb = nl.ndarray((t_count, h), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=hidden)
    xT = nl.ndarray((pkh, kth, t_count), dtype=dt, buffer=nl.sbuf)
    per_bank = PSUM_FP32 // ts
    for g0 in range(0, kth, per_bank):
        gn = min(per_bank, kth - g0)
        tp = nl.ndarray((P, per_bank, ts), dtype=dt, buffer=nl.psum)
        for j in range(gn):
            c0 = (g0 + j) * pkh
            nisa.nc_transpose(
                dst=tp[0:pkh, j, 0:t_count], data=x_sb[0:t_count, c0 : c0 + pkh],
                engine=nisa.engine.tensor,
            )  # fmt: skip
        nisa.tensor_copy(dst=xT[:, g0 : g0 + gn, :], src=tp[0:pkh, 0:gn, 0:t_count])

    # routing tables on every partition: ids (as fp32), weights, the touched experts
    ids_i = nl.ndarray((P, t_count, k), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ids_i, src=ids.ap([[0, P], [k, t_count], [1, k]]))
    ids_f = nl.ndarray((P, t_count, k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ids_f, src=ids_i)
    w_f = nl.ndarray((P, t_count, k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_f, src=weights.ap([[0, P], [k, t_count], [1, k]]))
    ex_i = nl.ndarray((P, e_count), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ex_i, src=experts.ap([[0, P], [1, e_count]]))
    ex_f = nl.ndarray((P, e_count), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ex_f, src=ex_i)
    acc = nl.ndarray((pkh, kth, t_count), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    tabs = (xT, ids_f, w_f, ex_i, ex_f, acc)
    ws = (w_gate_up, w_down)

    if static_count is not None:
        for i in range(pid, static_count, nprog):
            _expert(d, ws, tabs, nisa.register_alloc(i))
    else:
        cnt = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=cnt, src=n_touched)
        hi_r = nisa.register_alloc()
        nisa.register_load(hi_r, cnt)

        def body(i: Any) -> None:
            _expert(d, ws, tabs, i)

        nl.fori_loop(pid, hi_r, body, step=nprog)

    lo, hi = 0, kth
    if nprog > 1:  # the other program's partial sums, through shared HBM
        part = nl.ndarray((nprog, pkh, kth * t_count), dtype=nl.float32, buffer=nl.shared_hbm)
        mine = part.ap([[kth * t_count, pkh], [1, kth * t_count]], offset=pid * pkh * kth * t_count)
        nisa.dma_copy(dst=mine, src=acc)
        nisa.core_barrier(data=part, cores=tuple(range(nprog)))
        half = cdiv(kth, nprog)
        lo, hi = pid * half, min(kth, (pid + 1) * half)
        for q in range(nprog):
            if q == pid or hi <= lo:
                continue
            other = nl.ndarray((pkh, half, t_count), dtype=nl.float32, buffer=nl.sbuf)
            src = part.ap(
                [[kth * t_count, pkh], [1, (hi - lo) * t_count]],
                offset=q * pkh * kth * t_count + lo * t_count,
            )
            nisa.dma_copy(dst=other[:, 0 : hi - lo, :], src=src)
            nisa.tensor_tensor(
                dst=acc[:, lo:hi, :], data1=acc[:, lo:hi, :], data2=other[:, 0 : hi - lo, :],
                op=nl.add,
            )  # fmt: skip
    if hi > lo:
        _finish(d, acc, out, lo, hi)
    return out


def _finish(d: dict[str, Any], acc: Any, out: Any, lo: int, hi: int) -> None:
    """out[:, column tiles lo .. hi] = acc^T, rounded once to the output dtype."""
    t_count, pkh, ts = d["T"], d["pkh"], d["TS"]
    o_sb = nl.ndarray((t_count, (hi - lo) * pkh), dtype=d["dt"], buffer=nl.sbuf)
    group = PSUM_FP32 // P  # [T, 128] fp32 transposes per PSUM bank
    for g0 in range(lo, hi, group):
        gn = min(group, hi - g0)
        tp = nl.ndarray((ts, group * P), dtype=nl.float32, buffer=nl.psum)
        for j in range(gn):
            nisa.nc_transpose(
                dst=tp[0:t_count, j * pkh : (j + 1) * pkh], data=acc[:, g0 + j, :],
                engine=nisa.engine.tensor,
            )  # fmt: skip
        c0 = (g0 - lo) * pkh
        nisa.tensor_copy(dst=o_sb[:, c0 : c0 + gn * pkh], src=tp[0:t_count, 0 : gn * pkh])
    nisa.dma_copy(dst=out[:, lo * pkh : hi * pkh], src=o_sb)


def _expert(d: dict[str, Any], ws: tuple[Any, Any], tabs: tuple[Any, ...], i: Any) -> None:
    """acc += weights * expert experts[i] on all T tokens (its routed ones kept)."""
    t_count, k, e_count, dt = d["T"], d["k"], d["E"], d["dt"]
    xT, ids_f, w_f, ex_i, ex_f, acc = tabs
    # this expert's id: a (1, 1) offset for the weight loads and a column to compare ids to
    e1 = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    # on GpSimd (idle otherwise): the weight loads wait for it, and VectorE is still
    # finishing the previous expert
    eview = ex_i.ap([[e_count, 1], [1, 1]], scalar_offset=i, indirect_dim=1)
    nisa.tensor_copy(dst=e1, src=eview, engine=nisa.engine.gpsimd)
    ecol = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ecol, src=ex_f.ap([[e_count, P], [1, 1]], scalar_offset=i, indirect_dim=1))
    eq = nl.ndarray((P, t_count, k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=eq, data=ids_f, op0=nl.equal, operand0=ecol)
    routed = nl.ndarray((P, t_count), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=routed, op=nl.maximum, data=eq, axis=(2,))
    mask = nl.ndarray((P, t_count), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_copy(dst=mask, src=routed)
    # a token's weight for this expert: sum over its k slots of weight * (id == expert)
    wsel = nl.ndarray((P, t_count, k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=wsel, data1=eq, data2=w_f, op=nl.multiply)
    w_e = nl.ndarray((P, t_count), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=w_e, op=nl.add, data=wsel, axis=(2,))
    act = nl.ndarray((d["pki"], d["kti"], t_count), dtype=dt, buffer=nl.sbuf)
    _gate_up(d, ws[0], e1, xT, mask, act)
    _down(d, ws[1], e1, act, w_e, acc)


def _gate_up(d: dict[str, Any], w: Any, e1: Any, xT: Any, mask: Any, act: Any) -> None:
    """act [pki, kti, T] = silu(gate)^T * up^T, 0 in non-routed token columns."""
    t_count, inter, ts, dt = d["T"], d["I"], d["TS"], d["dt"]
    pkh, kth, pki, kti = d["pkh"], d["kth"], d["pki"], d["kti"]
    i2 = 2 * inter
    nq = min(kti, GU_BANKS * PSUM_FP32 // ts)  # I tiles per column group
    cw_max = nq * pki
    kc = max(1, min(kth, UNIT_BYTES // (2 * cw_max * d["isz"])))
    for q0 in range(0, kti, nq):
        qn = min(nq, kti - q0)
        cw, c0 = qn * pki, q0 * pki
        gps = nl.ndarray((P, nq, ts), dtype=nl.float32, buffer=nl.psum)
        ups = nl.ndarray((P, nq, ts), dtype=nl.float32, buffer=nl.psum)
        for t0 in range(0, kth, kc):
            tw = min(kc, kth - t0)
            wu = nl.ndarray((pkh, kc, 2 * cw_max), dtype=dt, buffer=nl.sbuf)
            row0 = t0 * pkh * i2
            if cw == inter:  # whole rows: one run of tw rows' gate and up columns each
                pat = [[i2, pkh], [pkh * i2, tw], [1, i2]]
                src = w.ap(pat, offset=row0, scalar_offset=e1, indirect_dim=0)
                nisa.dma_copy(dst=wu[:, 0:tw, 0:i2], src=src)
            else:
                for half, base in ((0, c0), (cw, inter + c0)):
                    pat = [[i2, pkh], [pkh * i2, tw], [1, cw]]
                    src = w.ap(pat, offset=row0 + base, scalar_offset=e1, indirect_dim=0)
                    nisa.dma_copy(dst=wu[:, 0:tw, half : half + cw], src=src)
            for t in range(tw):
                mov = xT[:, t0 + t, :]
                for q in range(qn):
                    for ps, base in ((gps, 0), (ups, cw)):
                        nisa.nc_matmul(
                            dst=ps[0:pki, q, 0:t_count],
                            stationary=wu[:, t, base + q * pki : base + (q + 1) * pki],
                            moving=mov,
                            accumulate=t0 + t != 0,
                        )
        sg = nl.ndarray((pki, nq, t_count), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sg[:, 0:qn, :], op=nl.silu, data=gps[0:pki, 0:qn, 0:t_count])
        dst = act[:, q0 : q0 + qn, :]
        nisa.tensor_tensor(dst=dst, data1=sg[:, 0:qn, :], data2=ups[0:pki, 0:qn, 0:t_count],
                           op=nl.multiply)  # fmt: skip
        pred = mask.ap([[t_count, pki], [0, qn], [1, t_count]])
        nisa.tensor_copy_predicated(dst=dst, src=0.0, predicate=pred, reverse_pred=True)


def _down(d: dict[str, Any], w: Any, e1: Any, act: Any, w_e: Any, acc: Any) -> None:
    """acc [pkh, kth, T] += (act^T W_down)^T * the tokens' weights."""
    t_count, h, ts, dt = d["T"], d["H"], d["TS"], d["dt"]
    pkh, kth, pki, kti = d["pkh"], d["kth"], d["pki"], d["kti"]
    nm = min(kth, DOWN_BANKS * PSUM_FP32 // ts)  # H tiles per column group
    hw_max = nm * pkh
    kc = max(1, min(kti, UNIT_BYTES // (hw_max * d["isz"])))
    for m0 in range(0, kth, nm):
        mn = min(nm, kth - m0)
        hw, h0 = mn * pkh, m0 * pkh
        yps = nl.ndarray((P, nm, ts), dtype=nl.float32, buffer=nl.psum)
        for t0 in range(0, kti, kc):
            tw = min(kc, kti - t0)
            wu = nl.ndarray((pki, kc, hw_max), dtype=dt, buffer=nl.sbuf)
            pat = [[h, pki], [pki * h, tw], [1, hw]]
            src = w.ap(pat, offset=t0 * pki * h + h0, scalar_offset=e1, indirect_dim=0)
            nisa.dma_copy(dst=wu[:, 0:tw, 0:hw], src=src)
            for t in range(tw):
                for m in range(mn):
                    nisa.nc_matmul(
                        dst=yps[0:pkh, m, 0:t_count],
                        stationary=wu[:, t, m * pkh : (m + 1) * pkh],
                        moving=act[:, t0 + t, :],
                        accumulate=t0 + t != 0,
                    )
        y = nl.ndarray((pkh, nm, t_count), dtype=nl.float32, buffer=nl.sbuf)
        wv = w_e.ap([[t_count, pkh], [0, mn], [1, t_count]])
        nisa.tensor_tensor(dst=y[:, 0:mn, :], data1=yps[0:pkh, 0:mn, 0:t_count], data2=wv,
                           op=nl.multiply)  # fmt: skip
        a = acc[:, m0 : m0 + mn, :]
        nisa.tensor_tensor(dst=a, data1=a, data2=y[:, 0:mn, :], op=nl.add)
