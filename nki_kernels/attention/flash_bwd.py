"""Flash attention backward as an NKI kernel: dq, dk, dv from the saved log-sum-exp.

Math (scale s, row statistics from the forward): P = exp(s * Q K^T - lse),
dV = P^T dO, dP = dO V^T, Delta = rowsum(dO * O), dS = P * (dP - Delta),
dQ = s * dS K, dK = s * dS^T Q.

Layout: scores keep queries on partitions (as in the forward), so every product but one
needs no transpose: P and dS [q, k] are directly the stationary operands of
dV += P^T dO and dK += dS^T Q (TensorE contracts over the query partitions), and
exp(s * S - lse) takes -lse as a per-partition bias. Only dQ = dS K contracts over keys:
dS is transposed per 128-key sub-tile (PE + PSUM evacuation, or DMA for 2-byte dtypes).

Loops, per batch b and key/value head g (program = (b, g); LNC splits the list):

    work items = (query head h of g's group, 128-row query tile t), in sections of
    `section` items whose Q, dO, Q^T, dO^T, -lse, Delta and fp32 dQ stay in SBUF
    for each section:
        for each 512-key block kb (K^T, V^T, K staged; DMA prefetched one block ahead):
            dK, dV accumulators for kb in PSUM, shared by all G heads: the GQA
            reduction happens on chip, in the matmul accumulation
            for each item whose tile plan touches kb (4-stage software pipeline:
            S/dP matmuls | mask, exp, dS | dV, dK, dS^T | dQ, accumulate):
                ...
            dK, dV of kb -> HBM (single section), or fp32 partial sums accumulated
            through an HBM scratch across sections
        dQ of the section's items -> HBM

PSUM: S and dP double-buffered (4 banks), dK and dV (2), dS^T (1), dQ (1) = 8 banks.
Masks: the same bounds / static tile plan as the forward; SKIP tiles issue nothing.
`lse` must hold +inf for rows without any allowed key (their P is then exactly 0).
Needs NeuronCore-v3+ (range_select). D <= 128.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nki, nl
from ._staging import (
    GROUP,
    P,
    compute_dtype,
    copy_engine,
    load_bounds,
    load_kt_group,
    stage_rows,
    transpose_kt_group,
    transpose_rows,
)

BLOCK = GROUP * P  # keys per block: one fp32 PSUM bank of scores
FP32_MIN = -3.4028235e38  # the fill value range_select requires (hardware constraint)


@nki.jit
def flash_attention_bwd(
    q, k, v, o, do, lse, bounds, softmax_scale, plan, section, dma_quarters, scalar_evac
):
    """dq [B, Hq, Sq, D], dk, dv [B, Hkv, Sk, D] (input dtypes) of attention(q, k, v).

    o, do: forward output and its gradient [B, Hq, Sq, D]; lse: fp32 [B, Hq, Sq]
    (+inf on empty rows); bounds / plan as in the forward; section: work items whose
    operands stay resident; dma_quarters: of every 4 dS^T sub-tiles, how many the DMA
    engines transpose (2-byte dtypes); scalar_evac: of every 4 PE-transposed sub-tiles,
    how many ScalarE copies out of PSUM (the rest VectorE).
    """
    batch, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    dq = nl.ndarray((batch, hq, sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((batch, hkv, sk, d), dtype=k.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((batch, hkv, sk, d), dtype=v.dtype, buffer=nl.shared_hbm)
    nprog, pid = (nl.num_programs(0), nl.program_id(0)) if nl.program_ndim() != 0 else (1, 0)
    cfg = (softmax_scale, section, dma_quarters, scalar_evac)
    ins = (q, k, v, o, do, lse, bounds)
    outs = (dq, dk, dv)
    pairs = [(b, g) for b in range(batch) for g in range(hkv)]
    for i in range(pid, len(pairs), nprog):
        b, g = pairs[i]
        classes = plan[b if len(plan) > 1 else 0] if len(plan) > 0 else ()
        _head_group(ins, outs, b, g, hq // hkv, classes, cfg, sq, sk, d)
    return dq, dk, dv


def _block_slots(classes: Any, t: int, kb: int, nk: int) -> list:
    """Sub-tiles of key block kb that query tile t computes: (slot, u, partial)."""
    slots = []
    for ul in range(GROUP):
        u = kb * GROUP + ul
        if u < nk:
            c = classes[t][u] if len(classes) > 0 else 2
            if c != 0:
                slots.append((ul, u, c == 1))
    return slots


def _runs(slots: list) -> list:
    """Runs of consecutive sub-tiles: (slot0, u0, count, partial)."""
    runs = []
    for ul, u, part in slots:
        if runs and runs[-1][1] + runs[-1][2] == u:
            r = runs[-1]
            runs[-1] = (r[0], r[1], r[2] + 1, r[3] or part)
        else:
            runs.append((ul, u, 1, part))
    return runs


def _head_group(ins, outs, b, g, group, classes, cfg, sq, sk, d):
    q, k, v, _, _, _, bounds = ins
    dq, dk, dv = outs
    section = cfg[1]
    cdt = compute_dtype(q.dtype)
    nq, nk = (sq + P - 1) // P, (sk + P - 1) // P
    nkb = (nk + GROUP - 1) // GROUP
    bnd = load_bounds(bounds, b, nq) if len(classes) > 0 else None
    items = []
    zero_rows = []
    for h in range(g * group, (g + 1) * group):
        for t in range(nq):
            per_kb = [_block_slots(classes, t, kb, nk) for kb in range(nkb)]
            if any(len(s) > 0 for s in per_kb):
                items.append({"h": h, "t": t, "rows": min(P, sq - t * P), "kb": per_kb})
            else:
                zero_rows.append((h, t))
    sections = [items[s0 : s0 + section] for s0 in range(0, len(items), section)]
    touch = [[[] for _ in range(GROUP)] for _ in range(nkb)]
    for si, sec in enumerate(sections):
        for it in sec:
            for kb in range(nkb):
                for ul, _, _ in it["kb"][kb]:
                    if len(touch[kb][ul]) == 0 or touch[kb][ul][-1] != si:
                        touch[kb][ul].append(si)
    scratch = None
    if len(sections) > 1:
        scratch = (
            nl.ndarray((sk, d), dtype=nl.float32, buffer=nl.hbm),
            nl.ndarray((sk, d), dtype=nl.float32, buffer=nl.hbm),
        )
    zeros = None
    if len(zero_rows) > 0 or any(
        len(touch[kb][ul]) == 0 for kb in range(nkb) for ul in range(GROUP)
    ):
        zeros = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0)
    for h, t in zero_rows:
        rows = min(P, sq - t * P)
        nisa.dma_copy(dst=dq[b, h, t * P : t * P + rows, :], src=zeros[:rows, :])
    for kb in range(nkb):
        for ul in range(GROUP):
            k0 = (kb * GROUP + ul) * P
            if k0 < sk and len(touch[kb][ul]) == 0:
                kr = min(P, sk - k0)
                nisa.dma_copy(dst=dk[b, g, k0 : k0 + kr, :], src=zeros[:kr, :])
                nisa.dma_copy(dst=dv[b, g, k0 : k0 + kr, :], src=zeros[:kr, :])

    loaded = _load_items(sections[0], ins, b, cdt, d) if len(sections) > 0 else None
    for si, sec in enumerate(sections):
        staged = loaded
        _prep_items(staged, bnd, cdt, d)
        if si + 1 < len(sections):
            loaded = _load_items(sections[si + 1], ins, b, cdt, d)
        dq_acc = nl.ndarray((P, len(sec), d), dtype=nl.float32, buffer=nl.sbuf)
        started = [False] * len(sec)
        active = [kb for kb in range(nkb) if any(len(it["kb"][kb]) > 0 for it in sec)]
        kv_next = _load_kv(k, v, b, g, active[0], sk, d, cdt) if len(active) > 0 else None
        for a, kb in enumerate(active):
            kv_raw = kv_next
            if a + 1 < len(active):
                kv_next = _load_kv(k, v, b, g, active[a + 1], sk, d, cdt)
            kv = _prep_kv(kv_raw, kb, sk, d, cdt)
            dkv = (
                nl.ndarray((P, GROUP, d), dtype=nl.float32, buffer=nl.psum),
                nl.ndarray((P, GROUP, d), dtype=nl.float32, buffer=nl.psum),
            )
            written = [False] * GROUP
            jobs = []
            for idx, it in enumerate(sec):
                if len(it["kb"][kb]) > 0:
                    jobs.append({"idx": idx, "slots": it["kb"][kb]})
            n = len(jobs)
            for i in range(n + 3):
                if i < n:
                    _stage_scores(jobs[i], staged, kv, kb, sk, d)
                if 0 <= i - 1 < n:
                    _stage_softmax(jobs[i - 1], staged, bnd, kb, cfg, cdt, sk)
                if 0 <= i - 2 < n:
                    _stage_grads(jobs[i - 2], staged, dkv, written, cfg, cdt, kb, sk, d)
                if 0 <= i - 3 < n:
                    _stage_dq(jobs[i - 3], staged, kv, dq_acc, started, kb, sk, d)
            _finish_block(
                dkv, written, touch[kb], si, kb, dk[b, g], dv[b, g], scratch, cfg[0], sk, d
            )
        for idx, it in enumerate(sec):
            rows = it["rows"]
            out_t = nl.ndarray((P, d), dtype=dq.dtype, buffer=nl.sbuf)
            nisa.activation(
                dst=out_t[:rows, :], op=nl.copy, data=dq_acc[:rows, idx, :], scale=cfg[0]
            )
            t0 = it["t"] * P
            nisa.dma_copy(dst=dq[b, it["h"], t0 : t0 + rows, :], src=out_t[:rows, :])
    return None


def _load_items(sec, ins, b, cdt, d):
    """DMA the per-item operands of a section (issued one section ahead)."""
    q, _, _, o, do, lse, _ = ins
    loaded = []
    for it in sec:
        rows, t0, h = it["rows"], it["t"] * P, it["h"]
        q_nat = nl.ndarray((P, d), dtype=cdt, buffer=nl.sbuf)
        nisa.dma_copy(dst=q_nat[:rows, :], src=q[b, h, t0 : t0 + rows, :])
        do_nat = nl.ndarray((P, d), dtype=cdt, buffer=nl.sbuf)
        nisa.dma_copy(dst=do_nat[:rows, :], src=do[b, h, t0 : t0 + rows, :])
        o_nat = nl.ndarray((P, d), dtype=cdt, buffer=nl.sbuf)
        nisa.dma_copy(dst=o_nat[:rows, :], src=o[b, h, t0 : t0 + rows, :])
        lse_c = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=lse_c[:rows, :], src=lse[b, h, t0 : t0 + rows])
        loaded.append({"it": it, "q": q_nat, "do": do_nat, "o": o_nat, "lse": lse_c})
    return loaded


def _prep_items(staged, bnd, cdt, d):
    """Q^T, dO^T (PE transposes), -lse and Delta = rowsum(dO * O) per item."""
    for n, st in enumerate(staged):
        rows = st["it"]["rows"]
        qt = nl.ndarray((d, P), dtype=cdt, buffer=nl.sbuf)
        transpose_rows(st["q"], rows, d, qt, cdt, n % 2 == 0)
        dot = nl.ndarray((d, P), dtype=cdt, buffer=nl.sbuf)
        transpose_rows(st["do"], rows, d, dot, cdt, n % 2 == 1)
        prod = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(
            dst=prod[:rows, :],
            data1=st["do"][:rows, :],
            data2=st["o"][:rows, :],
            op=nl.multiply,
            engine=nisa.engine.gpsimd,
        )
        delta = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=delta[:rows, :], op=nl.add, data=prod[:rows, :], axis=1)
        nlse = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(
            dst=nlse[:rows, :],
            data=st["lse"][:rows, :],
            op0=nl.multiply,
            operand0=-1.0,
            engine=nisa.engine.gpsimd,
        )
        st["qt"], st["dot"], st["delta"], st["nlse"] = qt, dot, delta, nlse
        st["o"] = None
        st["lse"] = None


def _load_kv(k, v, b, g, kb, sk, d, cdt):
    """DMA the K (twice: for K^T and natural) and V rows of key block kb."""
    k0 = kb * BLOCK
    n = min(BLOCK, sk - k0)
    kn = nl.ndarray((P, GROUP, d), dtype=cdt, buffer=nl.sbuf)
    stage_rows(k[b, g], kn, k0, n, t0=0)
    return {
        "k_raw": load_kt_group(k[b, g], k0, n, d, cdt),
        "v_raw": load_kt_group(v[b, g], k0, n, d, cdt),
        "kn": kn,
        "n": n,
    }


def _prep_kv(raw, kb, sk, d, cdt):
    """K^T and V^T of the block through PE transposes."""
    n = raw["n"]
    kt = nl.ndarray((d, BLOCK), dtype=cdt, buffer=nl.sbuf)
    transpose_kt_group(raw["k_raw"], kt, 0, n, d, cdt, True)
    vt = nl.ndarray((d, BLOCK), dtype=cdt, buffer=nl.sbuf)
    transpose_kt_group(raw["v_raw"], vt, 0, n, d, cdt, False)
    return {"kt": kt, "vt": vt, "kn": raw["kn"]}


def _cols(ul, u, cnt, sk):
    c0 = ul * P
    return c0, min(cnt * P, sk - u * P)


def _stage_scores(job, staged, kv, kb, sk, d):
    """TensorE: S = Q K^T and dP = dO V^T for the job's sub-tiles."""
    st = staged[job["idx"]]
    rows = st["it"]["rows"]
    s_ps = nl.ndarray((P, BLOCK), dtype=nl.float32, buffer=nl.psum)
    dp_ps = nl.ndarray((P, BLOCK), dtype=nl.float32, buffer=nl.psum)
    for ul, u, cnt, _ in _runs(job["slots"]):
        c0, nc = _cols(ul, u, cnt, sk)
        nisa.nc_matmul(
            dst=s_ps[:rows, c0 : c0 + nc],
            stationary=st["qt"][:d, :rows],
            moving=kv["kt"][:d, c0 : c0 + nc],
        )
        nisa.nc_matmul(
            dst=dp_ps[:rows, c0 : c0 + nc],
            stationary=st["dot"][:d, :rows],
            moving=kv["vt"][:d, c0 : c0 + nc],
        )
    job["s"] = s_ps
    job["dp"] = dp_ps


def _stage_softmax(job, staged, bnd, kb, cfg, cdt, sk):
    """Mask partial runs, P = exp(s * S - lse) (ScalarE), dS = P * (dP - Delta) (VectorE)."""
    st = staged[job["idx"]]
    rows = st["it"]["rows"]
    t = st["it"]["t"]
    p_sb = nl.ndarray((P, BLOCK), dtype=cdt, buffer=nl.sbuf)
    ds_sb = nl.ndarray((P, BLOCK), dtype=cdt, buffer=nl.sbuf)
    for ul, u, cnt, partial in _runs(job["slots"]):
        c0, nc = _cols(ul, u, cnt, sk)
        s_view = job["s"][:rows, c0 : c0 + nc]
        if partial:
            nisa.range_select(
                dst=s_view,
                on_true_tile=s_view,
                comp_op0=nl.greater_equal,
                comp_op1=nl.less,
                bound0=bnd[:rows, 0, t : t + 1],
                bound1=bnd[:rows, 1, t : t + 1],
                reduce_cmd=nisa.reduce_cmd.idle,
                range_start=u * P,
                on_false_value=FP32_MIN,
            )
        nisa.activation(
            dst=p_sb[:rows, c0 : c0 + nc],
            op=nl.exp,
            data=s_view,
            bias=st["nlse"][:rows, :],
            scale=cfg[0],
        )
        nisa.scalar_tensor_tensor(
            dst=ds_sb[:rows, c0 : c0 + nc],
            data=job["dp"][:rows, c0 : c0 + nc],
            op0=nl.subtract,
            operand0=st["delta"][:rows, :],
            op1=nl.multiply,
            operand1=p_sb[:rows, c0 : c0 + nc],
        )
    job["p"], job["ds"] = p_sb, ds_sb
    job["s"], job["dp"] = None, None


def _stage_grads(job, staged, dkv, written, cfg, cdt, kb, sk, d):
    """dV += P^T dO, dK += dS^T Q (PSUM accumulation), dS^T by PE or DMA transposes."""
    dma_quarters, scalar_evac = cfg[2], cfg[3]
    st = staged[job["idx"]]
    rows = st["it"]["rows"]
    dk_ps, dv_ps = dkv
    slots = job["slots"]
    for ul, u, _ in slots:
        kr = min(P, sk - u * P)
        cols = slice(ul * P, ul * P + kr)
        nisa.nc_matmul(
            dst=dv_ps[:kr, ul, :d],
            stationary=job["p"][:rows, cols],
            moving=st["do"][:rows, :d],
            accumulate=written[ul],
        )
        nisa.nc_matmul(
            dst=dk_ps[:kr, ul, :d],
            stationary=job["ds"][:rows, cols],
            moving=st["q"][:rows, :d],
            accumulate=written[ul],
        )
        written[ul] = True
    dst_sb = nl.ndarray((P, GROUP, P), dtype=cdt, buffer=nl.sbuf)
    full = all(min(P, sk - u * P) == P for _, u, _ in slots)
    n_dma = (
        min(dma_quarters, len(slots)) if cdt != nl.float32 and full and _contiguous(slots) else 0
    )
    pe = slots[: len(slots) - n_dma]
    if len(pe) > 0:
        tp = nl.ndarray((P, GROUP, P), dtype=cdt, buffer=nl.psum)
        for ul, u, _ in pe:
            kr = min(P, sk - u * P)
            nisa.nc_transpose(dst=tp[:kr, ul, :rows], data=job["ds"][:rows, ul * P : ul * P + kr])
        n_s = (len(pe) * scalar_evac + GROUP - 1) // GROUP
        for a, (ul, u, _) in enumerate(pe):
            kr = min(P, sk - u * P)
            nisa.tensor_copy(
                dst=dst_sb[:kr, ul, :rows], src=tp[:kr, ul, :rows], engine=copy_engine(a < n_s)
            )
    if n_dma > 0:
        ul0 = slots[len(pe)][0]
        src = job["ds"][:rows, ul0 * P : (ul0 + n_dma) * P].reshape((rows, n_dma, P))
        nisa.dma_transpose(dst=dst_sb[:, ul0 : ul0 + n_dma, :rows], src=src, axes=(2, 1, 0))
    job["dst"] = dst_sb
    job["p"], job["ds"] = None, None


def _contiguous(slots: list) -> bool:
    return all(slots[i + 1][0] == slots[i][0] + 1 for i in range(len(slots) - 1))


def _stage_dq(job, staged, kv, dq_acc, started, kb, sk, d):
    """dQ_block = dS K over the block's sub-tiles (PSUM), accumulated into fp32 SBUF."""
    idx = job["idx"]
    rows = staged[idx]["it"]["rows"]
    dq_ps = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.psum)
    for a, (ul, u, _) in enumerate(job["slots"]):
        kr = min(P, sk - u * P)
        nisa.nc_matmul(
            dst=dq_ps[:rows, :d],
            stationary=job["dst"][:kr, ul, :rows],
            moving=kv["kn"][:kr, ul, :d],
            accumulate=a > 0,
        )
    if started[idx]:
        nisa.tensor_tensor(
            dst=dq_acc[:rows, idx, :],
            data1=dq_acc[:rows, idx, :],
            data2=dq_ps[:rows, :d],
            op=nl.add,
        )
    else:
        nisa.activation(dst=dq_acc[:rows, idx, :], op=nl.copy, data=dq_ps[:rows, :d])
        started[idx] = True
    job["dst"] = None


def _finish_block(dkv, written, touch_kb, si, kb, dk_bg, dv_bg, scratch, scale, sk, d):
    """Write dK, dV of the block: directly, or through the fp32 HBM scratch across sections."""
    for ul in range(GROUP):
        if not written[ul]:
            continue
        k0 = (kb * GROUP + ul) * P
        kr = min(P, sk - k0)
        secs = touch_kb[ul]
        first, last = secs[0] == si, secs[-1] == si
        for w, ps, dst in ((0, dkv[0], dk_bg), (1, dkv[1], dv_bg)):
            sc = scale if w == 0 else 1.0
            if first and last:
                t_out = nl.ndarray((P, d), dtype=dst.dtype, buffer=nl.sbuf)
                nisa.activation(dst=t_out[:kr, :], op=nl.copy, data=ps[:kr, ul, :], scale=sc)
                nisa.dma_copy(dst=dst[k0 : k0 + kr, :], src=t_out[:kr, :])
                continue
            acc = scratch[w]
            cur = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
            if first:
                nisa.tensor_copy(dst=cur[:kr, :], src=ps[:kr, ul, :], engine=nisa.engine.scalar)
            else:
                nisa.dma_copy(dst=cur[:kr, :], src=acc[k0 : k0 + kr, :])
                nisa.tensor_tensor(
                    dst=cur[:kr, :], data1=cur[:kr, :], data2=ps[:kr, ul, :], op=nl.add
                )
            if last:
                t_out = nl.ndarray((P, d), dtype=dst.dtype, buffer=nl.sbuf)
                nisa.activation(dst=t_out[:kr, :], op=nl.copy, data=cur[:kr, :], scale=sc)
                nisa.dma_copy(dst=dst[k0 : k0 + kr, :], src=t_out[:kr, :])
            else:
                nisa.dma_copy(dst=acc[k0 : k0 + kr, :], src=cur[:kr, :])


__all__ = ["flash_attention_bwd"]
