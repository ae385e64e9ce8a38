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
- H and I are cut into 128-row tiles, the last one ragged (2880 = 22 x 128 + 64): weight
  units are [128, kc tiles, columns], each partition reading kc runs of whole rows (or of
  column groups of >= 4 KiB), and every full tile's load spans all 128 partitions, so
  all 16 DMA engines share it (a 120-partition tile would leave one idle). The buffers
  are renamed per unit, so the stream runs ahead across expert boundaries.
- LNC 2: the programs take alternate touched experts (`experts` lists them first), each
  keeping a partial fp32 sum; after a core barrier on the shared partials each program
  finishes half of the output columns.

- Weights stored transposed (`transposed` flags: w_gate_up as [E, 2I, H], w_down as
  [E, H, I], transformers' expert layout and nn.Linear's) are read where they lie by DMA
  transposes into the same [128, kc, columns] units, so the matmuls, their order and
  the result are those of the row-major layout. A routed expert's rows are gathered
  through a uint32 row index (expert * rows + row, built per expert on GpSimd), within
  nki.isa.dma_transpose's documented indirect limits (`tiles.load_weight_cols`: 2-byte
  dtypes, multiples of 16 rows, 128 elements per row; other rows and 4-byte dtypes are
  loaded as they lie and PE-transposed); the shared expert (no id) takes direct
  transposes. Transposed gate/up weights turn p-major off (it would need an element-
  strided transposing read).

Inputs: hidden [T, H]; w_gate_up [E, H, 2I] (gate columns then up); w_down [E, I, H];
ids [T, k] int32; weights [T, k] fp32; experts [1, E] int32 (the touched experts first);
n_touched [1, 1] int32; optional expert biases b_gate_up [E, 2I] / b_down [E, H] and a
shared expert, shared_gate_up [1, H, 2Is] / shared_down [1, Is, H] (and shared_gate
[1, H] for a sigmoid gate; with shared_up [1, H, Is], shared_gate_up is the gate's
[1, H, Is] alone), streamed first as one more expert on every token (weight 1
or sigmoid(x . g)), its intermediate tiles split between the programs. `static_count`
(pricing): the touched count, run as a static loop of the same body. `w_up` [E, H, I]:
the up projection as a tensor of its own (TorchTitan's w1 / w3), w_gate_up then being the
gate's [E, H, I] alone. Output [T, H] in hidden's dtype. `transposed` = (w_gate_up,
w_down, shared gate/up, shared_down) stored transposed, each [.., N, K] for [.., K, N].
"""

from __future__ import annotations

from typing import Any

from ..dtypes import dtype_bytes
from ..nki import nisa, nki, nl
from .decode_loads import load_cols, load_rows, runs
from .tiles import PSUM_FP32, P, cdiv, row_index_ok, row_ramp

UNIT_BYTES = 16 * 1024  # bytes per partition of one weight unit (2 MiB per load)
GU_BANKS = 3  # PSUM banks of the gate and of the up accumulators of one column group
DOWN_BANKS = 2  # PSUM banks of the down projection's accumulators (8 banks in all)
GATED = ("swiglu", "geglu", "gpt_oss")
PMAJOR_ROW_BYTES = 4096  # gate/up rows narrower than this are loaded p-major (one run)


def token_slot(t: int) -> int:
    """PSUM columns per token tile: the next power of two >= T, so no tile straddles a bank."""
    s = 1
    while s < t:
        s *= 2
    return s


def _rows(d: int, j: int) -> int:
    """Rows of 128-row tile j of a dim of size d."""
    return min(P, d - j * P)


def _program() -> tuple[int, int]:
    if nl.program_ndim() == 0 or nl.num_programs(0) == 1:
        return 0, 1
    return nl.program_id(0), nl.num_programs(0)


@nki.jit
def moe_decode_fwd(
    hidden, w_gate_up, w_down, ids, weights, experts, n_touched, b_gate_up=None, b_down=None,
    shared_gate_up=None, shared_down=None, shared_gate=None, shared_up=None, w_up=None,
    static_count=None, activation="swiglu", interleaved=False, alpha=1.702, limit=7.0,
    transposed=(False, False, False, False),
):  # fmt: skip
    """out [T, H] = the decode MoE layer (module docstring)."""
    t_count, h = hidden.shape
    gu_t, dn_t, sgu_t, sdn_t = transposed
    e_count, i2 = w_gate_up.shape[0], w_gate_up.shape[1 if gu_t else 2]
    if w_up is not None:  # w_gate_up is the gate's alone, w_up the up's (same layout)
        assert w_up.shape == w_gate_up.shape and not interleaved, "moe_decode_fwd: w_up"
        i2 *= 2
    inter = i2 // 2
    k = ids.shape[1]
    want = (e_count, h, inter) if dn_t else (e_count, inter, h)
    assert w_down.shape == want, "moe_decode_fwd: w_down is [E, I, H] ([E, H, I] transposed)"
    assert t_count <= PSUM_FP32 // 8, "moe_decode_fwd: T <= 64"
    dt = hidden.dtype
    pid, nprog = _program()
    kth, kti = cdiv(h, P), cdiv(inter, P)
    ts = token_slot(t_count)
    d = {"T": t_count, "H": h, "I": inter, "E": e_count, "k": k, "dt": dt, "TS": ts}
    d.update(kth=kth, kti=kti, isz=dtype_bytes(dt))
    assert activation in GATED, "moe_decode_fwd: activation is swiglu, geglu or gpt_oss"
    d.update(act=activation, il=interleaved, alpha=alpha, limit=limit)
    d["ones"] = None
    if b_gate_up is not None or b_down is not None:  # biases enter as K = 1 matmuls
        d["ones"] = nl.ndarray((1, t_count), dtype=dt, buffer=nl.sbuf)
        nisa.memset(dst=d["ones"], value=1.0)
    out = nl.ndarray((t_count, h), dtype=dt, buffer=nl.shared_hbm)

    # the touched experts' ids on one partition first: the weight stream waits only on it
    ex_row = nl.ndarray((1, e_count), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ex_row, src=experts)
    # this program's first expert's id, before any VectorE work: GpSimd waits for VectorE
    # perf-mode copies that hold their shared SBUF port (the setup's), so later ids are
    # copied in the loop, the first one here
    e1_first = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=e1_first, src=ex_row[0:1, pid : pid + 1], engine=nisa.engine.gpsimd)
    # gate/up rows narrower than PMAJOR_ROW_BYTES: hidden row p * kth + j on partition p of
    # tile j, so a partition's rows of a unit are one contiguous run (needs H % 128 == 0)
    d["pmajor"] = h % P == 0 and i2 * d["isz"] < PMAJOR_ROW_BYTES and not (gu_t or sgu_t)
    d.update(gu_t=gu_t, dn_t=dn_t, ramp=None)
    # routed weights stored transposed: a row index per expert and weight (module doc)
    d["ix_gu"] = gu_t and row_index_ok(w_gate_up)
    d["ix_dn"] = dn_t and row_index_ok(w_down)
    if d["ix_gu"] or d["ix_dn"]:
        d["ramp"] = row_ramp(max(_index_cols(d, "gu"), _index_cols(d, "dn")))
    # x^T [128, kth, T] once: PE transposes of x's column tiles (p-major: strided columns)
    x_sb = nl.ndarray((t_count, h), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=hidden)
    xT = nl.ndarray((P, kth, t_count), dtype=dt, buffer=nl.sbuf)
    per_bank = PSUM_FP32 // ts
    for g0 in range(0, kth, per_bank):
        for j0, jn, rows in runs(g0, min(kth, g0 + per_bank), h):
            tp = nl.ndarray((P, per_bank, ts), dtype=dt, buffer=nl.psum)
            for j in range(jn):
                c0 = (j0 + j) * P
                cols = x_sb[0:t_count, c0 : c0 + rows]
                if d["pmajor"]:
                    cols = x_sb[0:t_count, j0 + j : h - kth + j0 + j + 1 : kth]
                nisa.nc_transpose(
                    dst=tp[0:rows, j, 0:t_count], data=cols, engine=nisa.engine.tensor
                )
            nisa.tensor_copy(dst=xT[0:rows, j0 : j0 + jn, :], src=tp[0:rows, 0:jn, 0:t_count])

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
    # transposed weights: each touched expert's first row (id * rows) on every partition
    for kind, w in (("gu", w_gate_up), ("dn", w_down)):
        if d["ix_" + kind]:
            d["rows_" + kind] = nl.ndarray((P, e_count), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=d["rows_" + kind], data=ex_f, op0=nl.multiply,
                               operand0=float(w.shape[1]), engine=nisa.engine.gpsimd)  # fmt: skip
    acc = nl.ndarray((P, kth, t_count), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    tabs = (xT, ids_f, w_f, ex_row, ex_f, acc)
    ws = (w_gate_up, w_down, b_gate_up, b_down, w_up)
    if shared_gate_up is not None:  # first: its stream needs no expert id
        sh = (shared_gate_up, shared_down, shared_gate, shared_up)
        _shared(d, sh, (sgu_t, sdn_t), xT, acc, pid, nprog)

    if static_count is not None:
        for i in range(pid, static_count, nprog):
            _expert(d, ws, tabs, nisa.register_alloc(i), e1_first if i == pid else None)
    else:
        cnt = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=cnt, src=n_touched)
        hi_r = nisa.register_alloc()
        nisa.register_load(hi_r, cnt)
        # the first expert (if this program has one: a loop of 0 or 1 trips), then the rest
        one = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=one, data=cnt, op0=nl.minimum, operand0=pid + 1)
        one_r = nisa.register_alloc()
        nisa.register_load(one_r, one)

        def first(i: Any) -> None:
            _expert(d, ws, tabs, i, e1_first)

        def body(i: Any) -> None:
            _expert(d, ws, tabs, i)

        nl.fori_loop(pid, one_r, first)
        nl.fori_loop(pid + nprog, hi_r, body, step=nprog)

    lo, hi = 0, kth
    if nprog > 1:  # the other program's partial sums, through shared HBM
        span = kth * t_count
        part = nl.ndarray((nprog, P, span), dtype=nl.float32, buffer=nl.shared_hbm)
        mine = part.ap([[span, P], [1, span]], offset=pid * P * span)
        nisa.dma_copy(dst=mine, src=acc)
        nisa.core_barrier(data=part, cores=tuple(range(nprog)))
        half = cdiv(kth, nprog)
        lo, hi = pid * half, min(kth, (pid + 1) * half)
        for q in range(nprog):
            if q == pid or hi <= lo:
                continue
            other = nl.ndarray((P, half, t_count), dtype=nl.float32, buffer=nl.sbuf)
            src = part.ap([[span, P], [1, (hi - lo) * t_count]], offset=q * P * span + lo * t_count)
            nisa.dma_copy(dst=other[:, 0 : hi - lo, :], src=src)
            nisa.tensor_tensor(
                dst=acc[:, lo:hi, :], data1=acc[:, lo:hi, :], data2=other[:, 0 : hi - lo, :],
                op=nl.add,
            )  # fmt: skip
    if hi > lo:
        _finish(d, acc, out, lo, hi)
    return out


def _finish(d: dict[str, Any], acc: Any, out: Any, lo: int, hi: int) -> None:
    """out[:, column tiles lo .. hi] = acc^T, rounded once to the output dtype (rounded
    before the PE transposes, which are bit-exact: in the output dtype they cost less)."""
    t_count, h, ts, dt = d["T"], d["H"], d["TS"], d["dt"]
    c_lo, c_hi = lo * P, min(h, hi * P)
    rounded = nl.ndarray((P, hi - lo, t_count), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_copy(dst=rounded, src=acc[:, lo:hi, :])
    o_sb = nl.ndarray((t_count, (hi - lo) * P), dtype=dt, buffer=nl.sbuf)
    group = 4 * PSUM_FP32 // (P * d["isz"])  # [T, 128] transposes per 2 KiB PSUM bank
    for g0 in range(lo, hi, group):
        gn = min(group, hi - g0)
        tp = nl.ndarray((ts, group * P), dtype=dt, buffer=nl.psum)
        width = 0
        for j in range(gn):
            rows = _rows(h, g0 + j)
            nisa.nc_transpose(
                dst=tp[0:t_count, width : width + rows], data=rounded[0:rows, g0 + j - lo, :],
                engine=nisa.engine.tensor,
            )  # fmt: skip
            width += rows
        c0 = (g0 - lo) * P
        nisa.tensor_copy(dst=o_sb[:, c0 : c0 + width], src=tp[0:t_count, 0:width])
    nisa.dma_copy(dst=out[:, c_lo:c_hi], src=o_sb[:, 0 : c_hi - c_lo])


def _expert(
    d: dict[str, Any], ws: tuple[Any, ...], tabs: tuple[Any, ...], i: Any, e1: Any = None
) -> None:
    """acc += weights * expert experts[i] on all T tokens (its routed ones kept); `e1`:
    its id as a (1, 1) tile, when already copied."""
    t_count, k, e_count, dt = d["T"], d["k"], d["E"], d["dt"]
    xT, ids_f, w_f, ex_row, ex_f, acc = tabs
    # this expert's id: a (1, 1) offset for the weight loads and a column to compare ids to
    if e1 is None:
        e1 = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        # on GpSimd (idle otherwise): the weight loads wait for it, and VectorE is still
        # finishing the previous expert
        eview = ex_row.ap([[e_count, 1], [1, 1]], scalar_offset=i, indirect_dim=1)
        nisa.tensor_copy(dst=e1, src=eview, engine=nisa.engine.gpsimd)
    ecol = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    ecol_src = ex_f.ap([[e_count, P], [1, 1]], scalar_offset=i, indirect_dim=1)
    nisa.tensor_copy(dst=ecol, src=ecol_src)
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
    ix_gu = _row_index(d, "gu", i) if d["ix_gu"] else None
    ix_dn = _row_index(d, "dn", i) if d["ix_dn"] else None
    act = nl.ndarray((P, d["kti"], t_count), dtype=dt, buffer=nl.sbuf)
    gu = {"w": ws[0], "up": ws[4], "t": d["gu_t"], "ex": (e1, ix_gu)}
    _gate_up(d, (gu, _bias_row(ws[2], e1, dt)), xT, mask, act)
    dn = {"w": ws[1], "t": d["dn_t"], "ex": (e1, ix_dn)}
    _down(d, (dn, _bias_row(ws[3], e1, dt)), act, w_e, acc)


def _index_cols(d: dict[str, Any], kind: str) -> int:
    """Columns of a [128, k] row index covering the most rows one load gathers: a gate/up
    unit's 2 x min(I, group) columns, a down unit's min(H, group) columns."""
    if kind == "gu":
        nq = GU_BANKS * PSUM_FP32 // d["TS"]
        return cdiv(2 * min(d["I"], nq * P), P)
    nm = min(d["kth"], DOWN_BANKS * PSUM_FP32 // d["TS"])
    return cdiv(min(d["H"], nm * P), P)


def _row_index(d: dict[str, Any], kind: str, i: Any) -> Any:
    """[128, k] uint32: expert * rows + c * 128 + p, the rows of touched expert i's slice of
    the transposed weight seen as [E * rows, K] (ids times rows exact in fp32:
    `row_index_ok`). On GpSimd from the id * rows table: the weight loads wait only for
    it, not for VectorE, which is still finishing the previous expert."""
    e_count, k = d["E"], _index_cols(d, kind)
    base = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    src = d["rows_" + kind].ap([[e_count, P], [1, 1]], scalar_offset=i, indirect_dim=1)
    nisa.tensor_copy(dst=base, src=src, engine=nisa.engine.gpsimd)
    ix = nl.ndarray((P, k), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ix, data=d["ramp"][:, 0:k], op0=nl.add, operand0=base,
                       engine=nisa.engine.gpsimd)  # fmt: skip
    return ix


def _shared(d: dict[str, Any], sh: tuple[Any, ...], layout: tuple[bool, bool], xT: Any,
            acc: Any, pid: Any, nprog: int) -> None:  # fmt: skip
    """acc += gate * shared expert on all T tokens (gate: 1, or sigmoid(x . g) in fp32).
    Under LNC 2 each program takes half of its intermediate tiles (the partial sums are
    added after the barrier), so both stream half of its weights. `layout`: (gate/up,
    down) stored transposed."""
    gu, dn, g, up = sh
    gu_t, dn_t = layout
    t_count, inter = d["T"], dn.shape[2 if dn_t else 1]
    assert up is None or not d["il"], "moe_decode_fwd: a separate shared_up is not interleaved"
    kti = cdiv(inter, P)
    half = cdiv(kti, nprog)
    lo, hi = pid * half, min(kti, (pid + 1) * half)
    if hi <= lo:
        return
    ds = dict(d, I=inter, kti=kti, i_lo=lo, i_hi=hi)
    w_e = nl.ndarray((P, t_count), dtype=nl.float32, buffer=nl.sbuf)
    if g is None:
        nisa.memset(dst=w_e, value=1.0)
    else:
        _shared_gate(d, g, xT, w_e)
    e0 = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=e0, value=0)
    act = nl.ndarray((P, kti, t_count), dtype=d["dt"], buffer=nl.sbuf)
    _gate_up(ds, ({"w": gu, "up": up, "t": gu_t, "ex": (e0, "direct")}, None), xT, None, act)
    _down(ds, ({"w": dn, "t": dn_t, "ex": (e0, "direct")}, None), act, w_e, acc)


def _shared_gate(d: dict[str, Any], g: Any, xT: Any, w_e: Any) -> None:
    """w_e [128, T] = sigmoid(x_t . g) on every partition: the logits [1, T] accumulate
    in PSUM (g's tiles stationary, x^T moving), then a K = 1 matmul of a row of ones
    broadcasts them to the 128 partitions (fp32: the product by 1 is exact)."""
    t_count, h, kth, ts = d["T"], d["H"], d["kth"], d["TS"]
    g_sb = nl.ndarray((P, kth, 1), dtype=d["dt"], buffer=nl.sbuf)
    if d["pmajor"]:  # x^T tile j holds hidden columns p * kth + j
        nisa.dma_copy(dst=g_sb, src=g.ap([[kth, P], [1, kth], [1, 1]]))
    else:
        for first, count, rows in runs(0, kth, h):
            src = g.ap([[1, rows], [P, count], [1, 1]], offset=first * P)
            nisa.dma_copy(dst=g_sb[0:rows, first : first + count, :], src=src)
    lp = nl.ndarray((1, ts), dtype=nl.float32, buffer=nl.psum)
    for j in range(kth):
        r = _rows(h, j)
        nisa.nc_matmul(dst=lp[0:1, 0:t_count], stationary=g_sb[0:r, j, :],
                       moving=xT[0:r, j, :], accumulate=j != 0)  # fmt: skip
    logit = nl.ndarray((1, t_count), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=logit, src=lp[0:1, 0:t_count])
    ones = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    bp = nl.ndarray((P, ts), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=bp[:, 0:t_count], stationary=ones, moving=logit, accumulate=False)
    nisa.activation(dst=w_e, op=nl.sigmoid, data=bp[:, 0:t_count])


def _bias_row(b: Any, e1: Any, dt: Any) -> Any:
    """Expert e's bias row [1, N] on one partition (one contiguous DMA), or None."""
    if b is None:
        return None
    n = b.shape[1]
    row = nl.ndarray((1, n), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=b.ap([[n, 1], [1, n]], scalar_offset=e1, indirect_dim=0))
    return row


def _gate_up_parts(d: dict[str, Any], src: dict[str, Any], c0: int, cw: int) -> list[Any]:
    """(tensor, first gate/up column, width, unit column) runs of a column group [c0,
    c0 + cw) of I: the whole rows in one run, interleaved pairs in one run, else the gate
    and the up runs (from one tensor, or from the gate's and the up's)."""
    inter, w, up = d["I"], src["w"], src["up"]
    if up is not None:
        return [(w, c0, cw, 0), (up, c0, cw, cw)]
    if cw == inter:
        return [(w, 0, 2 * inter, 0)]
    if d["il"]:
        return [(w, 2 * c0, 2 * cw, 0)]
    return [(w, c0, cw, 0), (w, inter + c0, cw, cw)]


def _gate_up(d: dict[str, Any], wb: tuple[Any, Any], xT: Any, mask: Any, act: Any) -> None:
    """act [128, kti, T] = act(gate + b, up + b)^T, 0 in non-routed token columns (`mask`
    None: every token routed); I tiles d["i_lo"] .. d["i_hi"] (default: all)."""
    t_count, h, inter, ts, dt = d["T"], d["H"], d["I"], d["TS"], d["dt"]
    src, bias = wb
    kth, kti = d["kth"], d["kti"]
    lo, hi = d.get("i_lo", 0), d.get("i_hi", kti)
    nq = min(hi - lo, GU_BANKS * PSUM_FP32 // ts)  # I tiles per column group
    kc = max(1, min(kth, UNIT_BYTES // (2 * min(inter, nq * P) * d["isz"])))
    for q0 in range(lo, hi, nq):
        qn = min(nq, hi - q0)
        c0 = q0 * P
        cw = min(inter, c0 + qn * P) - c0
        gps = nl.ndarray((P, nq, ts), dtype=nl.float32, buffer=nl.psum)
        ups = nl.ndarray((P, nq, ts), dtype=nl.float32, buffer=nl.psum)
        parts = _gate_up_parts(d, src, c0, cw)
        # a chunk's gate / up columns in the unit (and in the bias row, offset by `b0`):
        # halves [base + q*128, + m), interleaved every other column from 2*q*128 (+1 up)
        if d["il"]:
            spans = ((gps, 0, 2), (ups, 1, 2))
        else:
            spans = ((gps, 0, 1), (ups, cw if cw != inter else inter, 1))
        b0 = 2 * c0 if d["il"] else c0
        for t0 in range(0, kth, kc):
            tw = min(kc, kth - t0)
            wu = nl.ndarray((P, kc, 2 * min(inter, nq * P)), dtype=dt, buffer=nl.sbuf)
            if src["t"]:
                load_cols(parts, src["ex"], t0, tw, h, wu)
            elif src["up"] is not None:  # the gate's and the up's own tensors
                for w, c_src, n, c_dst in parts:
                    load_rows(w, src["ex"][0], h, t0, tw, [(c_src, n, c_dst)], wu, d["pmajor"])
            else:
                cols = [(c_src, n, c_dst) for _, c_src, n, c_dst in parts]
                load_rows(src["w"], src["ex"][0], h, t0, tw, cols, wu, d["pmajor"])
            for t in range(tw):
                r = _rows(h, t0 + t)
                mov = xT[0:r, t0 + t, :]
                for q in range(qn):
                    m = _rows(inter, q0 + q)
                    for ps, base, st in spans:
                        c = base + st * q * P
                        nisa.nc_matmul(
                            dst=ps[0:m, q, 0:t_count],
                            stationary=wu[0:r, t, c : c + st * (m - 1) + 1 : st],
                            moving=mov,
                            accumulate=t0 + t != 0,
                        )
        if bias is not None:  # acc += b (x) 1: the bias on every token, in fp32
            for q in range(qn):
                m = _rows(inter, q0 + q)
                for ps, base, st in spans:
                    c = b0 + (base if d["il"] else (0 if ps is gps else inter)) + st * q * P
                    nisa.nc_matmul(
                        dst=ps[0:m, q, 0:t_count],
                        stationary=bias[0:1, c : c + st * (m - 1) + 1 : st],
                        moving=d["ones"],
                        accumulate=True,
                    )
        for j0, jn, rows in runs(q0, q0 + qn, inter):
            qa = j0 - q0
            g = gps[0:rows, qa : qa + jn, 0:t_count]
            u = ups[0:rows, qa : qa + jn, 0:t_count]
            dst = act[0:rows, j0 : j0 + jn, :]
            _activate(d, g, u, dst, (rows, nq, jn))
            if mask is None:
                continue
            pred = mask.ap([[t_count, rows], [0, jn], [1, t_count]])
            nisa.tensor_copy_predicated(dst=dst, src=0.0, predicate=pred, reverse_pred=True)


def _activate(d: dict[str, Any], g: Any, u: Any, dst: Any, dims: tuple[int, int, int]) -> None:
    """dst = the gated activation of the PSUM pre-activations g, u (fp32 math, one
    rounding on dst): silu(g) u | gelu(g) u | (clamp(u, -L, L) + 1) g' sigmoid(alpha g'),
    g' = min(g, L) (GPT-OSS)."""
    rows, nq, jn = dims
    t_count = d["T"]
    a = nl.ndarray((P, nq, t_count), dtype=nl.float32, buffer=nl.sbuf)
    av = a[0:rows, 0:jn, :]
    if d["act"] != "gpt_oss":
        op = nl.silu if d["act"] == "swiglu" else nl.gelu
        nisa.activation(dst=av, op=op, data=g)
        nisa.tensor_tensor(dst=dst, data1=av, data2=u, op=nl.multiply)
        return
    lim = d["limit"]
    gc = nl.ndarray((P, nq, t_count), dtype=nl.float32, buffer=nl.sbuf)
    gv = gc[0:rows, 0:jn, :]
    nisa.tensor_scalar(dst=gv, data=g, op0=nl.minimum, operand0=lim)
    uc = nl.ndarray((P, nq, t_count), dtype=nl.float32, buffer=nl.sbuf)
    uv = uc[0:rows, 0:jn, :]
    nisa.tensor_scalar(dst=uv, data=u, op0=nl.minimum, operand0=lim, op1=nl.maximum, operand1=-lim)
    nisa.activation(dst=av, op=nl.sigmoid, data=gv, scale=d["alpha"])
    nisa.tensor_tensor(dst=av, data1=av, data2=gv, op=nl.multiply)
    nisa.scalar_tensor_tensor(
        dst=dst, data=uv, op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=av
    )


def _down(d: dict[str, Any], wb: tuple[Any, Any], act: Any, w_e: Any, acc: Any) -> None:
    """acc [128, kth, T] += ((act^T W_down)^T + b) * the tokens' weights."""
    t_count, h, inter, ts, dt = d["T"], d["H"], d["I"], d["TS"], d["dt"]
    src, bias = wb
    kth, kti = d["kth"], d["kti"]
    lo, hi = d.get("i_lo", 0), d.get("i_hi", kti)  # the I tiles (rows of W_down) to sum
    nm = min(kth, DOWN_BANKS * PSUM_FP32 // ts)  # H tiles per column group
    kc = max(1, min(hi - lo, UNIT_BYTES // (nm * P * d["isz"])))
    for m0 in range(0, kth, nm):
        mn = min(nm, kth - m0)
        h0 = m0 * P
        hw = min(h, h0 + mn * P) - h0
        yps = nl.ndarray((P, nm, ts), dtype=nl.float32, buffer=nl.psum)
        for t0 in range(lo, hi, kc):
            tw = min(kc, hi - t0)
            wu = nl.ndarray((P, kc, nm * P), dtype=dt, buffer=nl.sbuf)
            if src["t"]:
                load_cols([(src["w"], h0, hw, 0)], src["ex"], t0, tw, inter, wu)
            else:
                load_rows(src["w"], src["ex"][0], inter, t0, tw, [(h0, hw, 0)], wu)
            for t in range(tw):
                r = _rows(inter, t0 + t)
                for m in range(mn):
                    c = _rows(h, m0 + m)
                    nisa.nc_matmul(
                        dst=yps[0:c, m, 0:t_count],
                        stationary=wu[0:r, t, m * P : m * P + c],
                        moving=act[0:r, t0 + t, :],
                        accumulate=t0 + t != lo,
                    )
        if bias is not None:
            for m in range(mn):
                c = _rows(h, m0 + m)
                nisa.nc_matmul(
                    dst=yps[0:c, m, 0:t_count],
                    stationary=bias[0:1, h0 + m * P : h0 + m * P + c],
                    moving=d["ones"],
                    accumulate=True,
                )
        for j0, jn, rows in runs(m0, m0 + mn, h):
            ma = j0 - m0
            y = nl.ndarray((P, nm, t_count), dtype=nl.float32, buffer=nl.sbuf)
            wv = w_e.ap([[t_count, rows], [0, jn], [1, t_count]])
            yp = yps[0:rows, ma : ma + jn, 0:t_count]
            nisa.tensor_tensor(dst=y[0:rows, 0:jn, :], data1=yp, data2=wv, op=nl.multiply)
            a = acc[0:rows, j0 : j0 + jn, :]
            nisa.tensor_tensor(dst=a, data1=a, data2=y[0:rows, 0:jn, :], op=nl.add)
