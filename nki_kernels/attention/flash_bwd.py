"""Flash attention backward as an NKI kernel: dq, dk, dv from the saved log-sum-exp.

Math (scale s, row statistics from the forward): P = exp(s * Q K^T - lse),
dV = P^T dO, dP = dO V^T, Delta = rowsum(dO * O) - dlse, dS = P * (dP - Delta),
dQ = s * dS K, dK = s * dS^T Q (dlse: gradient w.r.t. the returned lse, usually 0).

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
BANK_F32 = 512  # fp32 elements per partition in one 2 KiB PSUM bank
FP32_MIN = -3.4028235e38  # the fill value range_select requires (hardware constraint)
JOB_RING = 3  # P, dS, dS^T buffers rotate over 3 jobs (written stage 2/3, read stage 3/4)
OUT_RING = 4  # dQ tiles waiting for their store DMA


@nki.jit
def flash_attention_bwd(
    q, k, v, o, do, lse, dlse, bounds, softmax_scale, plan, section, dma_quarters, scalar_evac
):
    """dq [B, Hq, Sq, D], dk, dv [B, Hkv, Sk, D] (input dtypes) of attention(q, k, v).

    o, do: forward output and its gradient [B, Hq, Sq, D]; lse: fp32 [B, Hq, 128, nq],
    partition-major as the forward writes it (+inf on empty rows); dlse: None or the
    gradient of lse in the same layout (it enters as Delta - dlse); bounds / plan as in
    the forward; section: work items whose operands stay resident; dma_quarters: of
    every 4 dS^T sub-tiles, how many the DMA engines transpose (2-byte dtypes);
    scalar_evac: eighths of the PE-transposed sub-tiles that ScalarE copies out of PSUM
    (the rest VectorE).
    """
    batch, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    dq = nl.ndarray((batch, hq, sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((batch, hkv, sk, d), dtype=k.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((batch, hkv, sk, d), dtype=v.dtype, buffer=nl.shared_hbm)
    nprog, pid = (nl.num_programs(0), nl.program_id(0)) if nl.program_ndim() != 0 else (1, 0)
    cfg = (softmax_scale, section, dma_quarters, scalar_evac)
    ins = (q, k, v, o, do, lse, dlse, bounds)
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


def _runs(slots: list, split_masked: bool = False) -> list:
    """Runs of consecutive sub-tiles: (slot0, u0, count, partial); with `split_masked`
    PARTIAL and FULL sub-tiles never share a run (the mask covers only what needs it)."""
    runs: list[tuple[int, int, int, bool]] = []
    for ul, u, part in slots:
        same = not split_masked or (runs and runs[-1][3] == part)
        if runs and same and runs[-1][1] + runs[-1][2] == u:
            r = runs[-1]
            runs[-1] = (r[0], r[1], r[2] + 1, r[3] or part)
        else:
            runs.append((ul, u, 1, part))
    return runs


def _head_group(ins, outs, b, g, group, classes, cfg, sq, sk, d):
    q, k, v, _, _, _, _, bounds = ins
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
    _write_zeros(dq, dk, dv, b, g, zero_rows, touch, sq, sk, d)
    scratch = None
    if len(sections) > 1:
        scratch = (
            nl.ndarray((sk, d), dtype=nl.float32, buffer=nl.hbm),
            nl.ndarray((sk, d), dtype=nl.float32, buffer=nl.hbm),
        )
    rings = _rings(cdt, d, dk.dtype)
    jc = 0  # jobs issued so far: ring slots rotate on it across block boundaries
    bc = 0  # key blocks staged so far
    loaded = _load_items(sections[0], ins, b, cdt, d, rings, 0) if len(sections) > 0 else None
    for si, sec in enumerate(sections):
        staged = loaded
        _prep_items(staged, rings, cdt, d)
        if si + 1 < len(sections):
            loaded = _load_items(sections[si + 1], ins, b, cdt, d, rings, si + 1)
        dq_acc = nl.ndarray((P, len(sec), d), dtype=nl.float32, buffer=nl.sbuf)
        started = [False] * len(sec)
        active = [kb for kb in range(nkb) if any(len(it["kb"][kb]) > 0 for it in sec)]
        kv_next = None
        if len(active) > 0:
            kv_next = _load_kv(k, v, b, g, active[0], sk, d, cdt, rings, bc)
        for a, kb in enumerate(active):
            kv_raw = kv_next
            if a + 1 < len(active):
                kv_next = _load_kv(k, v, b, g, active[a + 1], sk, d, cdt, rings, bc + 1)
            kv = _prep_kv(kv_raw, rings, bc, d, cdt)
            bc += 1
            written = [False] * GROUP
            jobs = []
            for idx, it in enumerate(sec):
                if len(it["kb"][kb]) > 0:
                    jobs.append({"idx": idx, "slots": it["kb"][kb]})
            n = len(jobs)
            # Four-stage software pipeline in issue order per iteration i: S and dP of
            # job i; mask, exp and dS of job i - 1; dV, dK and the dS^T transposes of
            # job i - 2; dQ of job i - 3 (its transposes were evacuated an iteration ago).
            for i in range(n + 3):
                if i < n:
                    _stage_scores(jobs[i], jc + i, staged, rings, kv, sk, d)
                if 0 <= i - 1 < n:
                    _stage_softmax(jobs[i - 1], jc + i - 1, staged, rings, bnd, cfg, sk)
                if 0 <= i - 2 < n:
                    _stage_grads(jobs[i - 2], jc + i - 2, staged, rings, written, cfg, cdt, sk, d)
                if 0 <= i - 3 < n:
                    _stage_dq(jobs[i - 3], jc + i - 3, staged, rings, kv, dq_acc, started, sk, d)
            jc += n
            _finish_block(
                rings, bc, written, touch[kb], si, kb, dk[b, g], dv[b, g], scratch, cfg[0], sk, d
            )
        for idx, it in enumerate(sec):
            rows = it["rows"]
            out_t = rings["dq_out"][idx % OUT_RING]
            nisa.activation(
                dst=out_t[:rows, :], op=nl.copy, data=dq_acc[:rows, idx, :], scale=cfg[0]
            )
            t0 = it["t"] * P
            nisa.dma_copy(dst=dq[b, it["h"], t0 : t0 + rows, :], src=out_t[:rows, :])
    return None


def _write_zeros(dq, dk, dv, b, g, zero_rows, touch, sq, sk, d):
    """Query tiles and key sub-tiles that no allowed pair touches get zero gradients."""
    nkb = len(touch)
    empty_keys = [
        (kb, ul)
        for kb in range(nkb)
        for ul in range(GROUP)
        if (kb * GROUP + ul) * P < sk and len(touch[kb][ul]) == 0
    ]
    if len(zero_rows) == 0 and len(empty_keys) == 0:
        return
    zeros = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0)
    for h, t in zero_rows:
        rows = min(P, sq - t * P)
        nisa.dma_copy(dst=dq[b, h, t * P : t * P + rows, :], src=zeros[:rows, :])
    for kb, ul in empty_keys:
        k0 = (kb * GROUP + ul) * P
        kr = min(P, sk - k0)
        nisa.dma_copy(dst=dk[b, g, k0 : k0 + kr, :], src=zeros[:kr, :])
        nisa.dma_copy(dst=dv[b, g, k0 : k0 + kr, :], src=zeros[:kr, :])


def _rings(cdt, d, kv_dtype):
    """Buffers rotated by job / block index, so a buffer is rewritten only well after
    its last reader (in-order engines then never wait on write-after-read)."""
    f32, sb, ps = nl.float32, nl.sbuf, nl.psum
    r = {
        "s": [nl.ndarray((P, BLOCK), dtype=f32, buffer=ps) for _ in range(2)],
        "dp": [nl.ndarray((P, BLOCK), dtype=f32, buffer=ps) for _ in range(2)],
        "dk": nl.ndarray((P, GROUP, d), dtype=f32, buffer=ps),
        "dv": nl.ndarray((P, GROUP, d), dtype=f32, buffer=ps),
        # two banks shared by the dS^T transposes and dQ (2-byte dtypes: both in one bank,
        # double-buffered; fp32: bank 0 transposes, bank 1 dQ)
        "aux": [nl.ndarray((P, BANK_F32), dtype=f32, buffer=ps) for _ in range(2)],
        "p": [nl.ndarray((P, BLOCK), dtype=cdt, buffer=sb) for _ in range(JOB_RING)],
        "ds": [nl.ndarray((P, BLOCK), dtype=cdt, buffer=sb) for _ in range(JOB_RING)],
        "dst": [nl.ndarray((P, GROUP, P), dtype=cdt, buffer=sb) for _ in range(JOB_RING)],
        "kt": [nl.ndarray((d, BLOCK), dtype=cdt, buffer=sb) for _ in range(2)],
        "vt": [nl.ndarray((d, BLOCK), dtype=cdt, buffer=sb) for _ in range(2)],
        "kn": [nl.ndarray((P, GROUP, d), dtype=cdt, buffer=sb) for _ in range(2)],
        "k_raw": [nl.ndarray((P, GROUP, d), dtype=cdt, buffer=sb) for _ in range(2)],
        "v_raw": [nl.ndarray((P, GROUP, d), dtype=cdt, buffer=sb) for _ in range(2)],
        "blk": [nl.ndarray((P, GROUP, d), dtype=f32, buffer=sb) for _ in range(2)],
        "blk_out": [nl.ndarray((P, GROUP, d), dtype=kv_dtype, buffer=sb) for _ in range(4)],
        "dq_out": [nl.ndarray((P, d), dtype=cdt, buffer=sb) for _ in range(OUT_RING)],
    }
    r["two_byte"] = cdt != f32
    return r


def _tp_view(rings, slot, cdt):
    """A [128, 4, 128] cdt view of aux bank `slot` for PE transposes."""
    bank = rings["aux"][slot % 2] if rings["two_byte"] else rings["aux"][0]
    if rings["two_byte"]:
        return bank[:, 0 : BANK_F32 // 2].view(cdt).reshape((P, GROUP, P))
    return bank.reshape((P, GROUP, P))


def _dq_view(rings, slot, d):
    if rings["two_byte"]:
        return rings["aux"][slot % 2][:, BANK_F32 // 2 : BANK_F32 // 2 + d]
    return rings["aux"][1][:, 0:d]


def _load_items(sec, ins, b, cdt, d, rings, si):
    """DMA the per-item operands of a section (issued one section ahead)."""
    q, _, _, o, do, lse, dlse, _ = ins
    n = len(sec)
    q_nat = nl.ndarray((P, n, d), dtype=cdt, buffer=nl.sbuf)
    do_nat = nl.ndarray((P, n, d), dtype=cdt, buffer=nl.sbuf)
    o_nat = nl.ndarray((P, n, d), dtype=cdt, buffer=nl.sbuf)
    lse_c = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    dlse_c = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf) if dlse is not None else None
    for x, it in enumerate(sec):
        rows, t0, h = it["rows"], it["t"] * P, it["h"]
        nisa.dma_copy(dst=q_nat[:rows, x, :], src=q[b, h, t0 : t0 + rows, :])
        nisa.dma_copy(dst=do_nat[:rows, x, :], src=do[b, h, t0 : t0 + rows, :])
        nisa.dma_copy(dst=o_nat[:rows, x, :], src=o[b, h, t0 : t0 + rows, :])
    # statistics: one DMA per run of consecutive query tiles of one head (a contiguous
    # run of floats per partition in the partition-major layout)
    x0 = 0
    while x0 < n:
        x1 = x0 + 1
        while x1 < n and sec[x1]["h"] == sec[x0]["h"] and sec[x1]["t"] == sec[x1 - 1]["t"] + 1:
            x1 += 1
        h, ta, tb = sec[x0]["h"], sec[x0]["t"], sec[x1 - 1]["t"] + 1
        nisa.dma_copy(dst=lse_c[:, x0:x1], src=lse[b, h, :, ta:tb])
        if dlse_c is not None:
            nisa.dma_copy(dst=dlse_c[:, x0:x1], src=dlse[b, h, :, ta:tb])
        x0 = x1
    return {"items": sec, "q": q_nat, "do": do_nat, "o": o_nat, "lse": lse_c, "dlse": dlse_c}


def _prep_items(staged, rings, cdt, d):
    """Q^T, dO^T (PE transposes), -lse and Delta = rowsum(dO * O) of a section."""
    sec = staged["items"]
    n = len(sec)
    qt = nl.ndarray((d, n, P), dtype=cdt, buffer=nl.sbuf)
    dot = nl.ndarray((d, n, P), dtype=cdt, buffer=nl.sbuf)
    delta = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    nlse = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    for x, it in enumerate(sec):
        rows = it["rows"]
        tp = _tp_view(rings, x, cdt)
        transpose_rows(staged["q"][:, x, :], rows, d, qt[:, x, :], cdt, True, tp=tp[:, 0, :])
        transpose_rows(staged["do"][:, x, :], rows, d, dot[:, x, :], cdt, False, tp=tp[:, 1, :])
        prod = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(
            dst=prod[:rows, :],
            data1=staged["do"][:rows, x, :],
            data2=staged["o"][:rows, x, :],
            op=nl.multiply,
            engine=nisa.engine.gpsimd,
        )
        nisa.tensor_reduce(dst=delta[:rows, x : x + 1], op=nl.add, data=prod[:rows, :], axis=1)
        if staged["dlse"] is not None:
            nisa.tensor_tensor(
                dst=delta[:rows, x : x + 1],
                data1=delta[:rows, x : x + 1],
                data2=staged["dlse"][:rows, x : x + 1],
                op=nl.subtract,
                engine=nisa.engine.gpsimd,
            )
        nisa.tensor_scalar(
            dst=nlse[:rows, x : x + 1],
            data=staged["lse"][:rows, x : x + 1],
            op0=nl.multiply,
            operand0=-1.0,
            engine=nisa.engine.gpsimd,
        )
    staged["qt"], staged["dot"], staged["delta"], staged["nlse"] = qt, dot, delta, nlse
    staged["o"] = None
    staged["lse"] = None


def _load_kv(k, v, b, g, kb, sk, d, cdt, rings, slot):
    """DMA the K (twice: for K^T and natural) and V rows of key block kb."""
    k0 = kb * BLOCK
    n = min(BLOCK, sk - k0)
    kn = rings["kn"][slot % 2]
    stage_rows(k[b, g], kn, k0, n, t0=0)
    if n == BLOCK:
        k_raw, v_raw = rings["k_raw"][slot % 2], rings["v_raw"][slot % 2]
        nisa.dma_copy(dst=k_raw, src=k[b, g][k0 : k0 + n, :].reshape((P, GROUP, d)))
        nisa.dma_copy(dst=v_raw, src=v[b, g][k0 : k0 + n, :].reshape((P, GROUP, d)))
    else:
        k_raw = load_kt_group(k[b, g], k0, n, d, cdt)
        v_raw = load_kt_group(v[b, g], k0, n, d, cdt)
    return {"k_raw": k_raw, "v_raw": v_raw, "kn": kn, "n": n}


def _prep_kv(raw, rings, slot, d, cdt):
    """K^T and V^T of the block through PE transposes."""
    n = raw["n"]
    kt, vt = rings["kt"][slot % 2], rings["vt"][slot % 2]
    transpose_kt_group(raw["k_raw"], kt, 0, n, d, cdt, True, tp=_tp_view(rings, 0, cdt))
    transpose_kt_group(raw["v_raw"], vt, 0, n, d, cdt, False, tp=_tp_view(rings, 1, cdt))
    return {"kt": kt, "vt": vt, "kn": raw["kn"]}


def _cols(ul, u, cnt, sk):
    c0 = ul * P
    return c0, min(cnt * P, sk - u * P)


def _stage_scores(job, i, staged, rings, kv, sk, d):
    """TensorE: S = Q K^T and dP = dO V^T for the job's sub-tiles."""
    x = job["idx"]
    rows = staged["items"][x]["rows"]
    s_ps, dp_ps = rings["s"][i % 2], rings["dp"][i % 2]
    for ul, u, cnt, _ in _runs(job["slots"]):
        c0, nc = _cols(ul, u, cnt, sk)
        nisa.nc_matmul(
            dst=s_ps[:rows, c0 : c0 + nc],
            stationary=staged["qt"][:d, x, :rows],
            moving=kv["kt"][:d, c0 : c0 + nc],
            accumulate=False,
        )
        nisa.nc_matmul(
            dst=dp_ps[:rows, c0 : c0 + nc],
            stationary=staged["dot"][:d, x, :rows],
            moving=kv["vt"][:d, c0 : c0 + nc],
            accumulate=False,
        )


def _stage_softmax(job, i, staged, rings, bnd, cfg, sk):
    """Mask partial runs, P = exp(s * S - lse) (ScalarE), dS = P * (dP - Delta) (VectorE)."""
    x = job["idx"]
    it = staged["items"][x]
    rows, t = it["rows"], it["t"]
    s_ps, dp_ps = rings["s"][i % 2], rings["dp"][i % 2]
    p_sb, ds_sb = rings["p"][i % JOB_RING], rings["ds"][i % JOB_RING]
    for ul, u, cnt, partial in _runs(job["slots"], split_masked=True):
        c0, nc = _cols(ul, u, cnt, sk)
        s_view = s_ps[:rows, c0 : c0 + nc]
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
            bias=staged["nlse"][:rows, x : x + 1],
            scale=cfg[0],
        )
        nisa.scalar_tensor_tensor(
            dst=ds_sb[:rows, c0 : c0 + nc],
            data=dp_ps[:rows, c0 : c0 + nc],
            op0=nl.subtract,
            operand0=staged["delta"][:rows, x : x + 1],
            op1=nl.multiply,
            operand1=p_sb[:rows, c0 : c0 + nc],
        )


def _stage_grads(job, i, staged, rings, written, cfg, cdt, sk, d):
    """dV += P^T dO, dK += dS^T Q (PSUM accumulation), dS^T by PE or DMA transposes."""
    dma_quarters, scalar_evac = cfg[2], cfg[3]
    x = job["idx"]
    rows = staged["items"][x]["rows"]
    p_sb, ds_sb = rings["p"][i % JOB_RING], rings["ds"][i % JOB_RING]
    slots = job["slots"]
    for ul, u, _ in slots:
        kr = min(P, sk - u * P)
        cols = slice(ul * P, ul * P + kr)
        nisa.nc_matmul(
            dst=rings["dv"][:kr, ul, :d],
            stationary=p_sb[:rows, cols],
            moving=staged["do"][:rows, x, :d],
            accumulate=written[ul],
        )
        nisa.nc_matmul(
            dst=rings["dk"][:kr, ul, :d],
            stationary=ds_sb[:rows, cols],
            moving=staged["q"][:rows, x, :d],
            accumulate=written[ul],
        )
        written[ul] = True
    dst_sb = rings["dst"][i % JOB_RING]
    full = all(min(P, sk - u * P) == P for _, u, _ in slots)
    n_dma = 0
    if rings["two_byte"] and full and _contiguous(slots):
        n_dma = min(dma_quarters, len(slots))
    pe = slots[: len(slots) - n_dma]
    if len(pe) > 0:
        tp = _tp_view(rings, i, cdt)
        for ul, u, _ in pe:
            kr = min(P, sk - u * P)
            nisa.nc_transpose(dst=tp[:kr, ul, :rows], data=ds_sb[:rows, ul * P : ul * P + kr])
        n_s = (len(pe) * scalar_evac + 4) // 8
        for on_scalar, part in ((True, pe[:n_s]), (False, pe[n_s:])):
            for ul, u, _ in part:
                kr = min(P, sk - u * P)
                nisa.tensor_copy(
                    dst=dst_sb[:kr, ul, :rows],
                    src=tp[:kr, ul, :rows],
                    engine=copy_engine(on_scalar),
                )
    if n_dma > 0:
        ul0 = slots[len(pe)][0]
        src = ds_sb[:rows, ul0 * P : (ul0 + n_dma) * P].reshape((rows, n_dma, P))
        nisa.dma_transpose(dst=dst_sb[:, ul0 : ul0 + n_dma, :rows], src=src, axes=(2, 1, 0))


def _contiguous(slots: list) -> bool:
    return all(slots[i + 1][0] == slots[i][0] + 1 for i in range(len(slots) - 1))


def _stage_dq(job, i, staged, rings, kv, dq_acc, started, sk, d):
    """dQ_block = dS K over the block's sub-tiles (PSUM), accumulated into fp32 SBUF."""
    x = job["idx"]
    rows = staged["items"][x]["rows"]
    dq_ps = _dq_view(rings, i, d)
    dst_sb = rings["dst"][i % JOB_RING]
    for a, (ul, u, _) in enumerate(job["slots"]):
        kr = min(P, sk - u * P)
        nisa.nc_matmul(
            dst=dq_ps[:rows, :d],
            stationary=dst_sb[:kr, ul, :rows],
            moving=kv["kn"][:kr, ul, :d],
            accumulate=a > 0,
        )
    if started[x]:
        nisa.tensor_tensor(
            dst=dq_acc[:rows, x, :], data1=dq_acc[:rows, x, :], data2=dq_ps[:rows, :d], op=nl.add
        )
    else:
        nisa.activation(dst=dq_acc[:rows, x, :], op=nl.copy, data=dq_ps[:rows, :d])
        started[x] = True


def _finish_block(rings, bc, written, touch_kb, si, kb, dk_bg, dv_bg, scratch, scale, sk, d):
    """Write dK, dV of the block: directly, or through the fp32 HBM scratch across sections."""
    for w, dst in ((0, dk_bg), (1, dv_bg)):
        ps = rings["dk"] if w == 0 else rings["dv"]
        sc = scale if w == 0 else 1.0
        out_t = rings["blk_out"][(2 * bc + w) % 4]
        cur = rings["blk"][(2 * bc + w) % 2]
        for ul in range(GROUP):
            if not written[ul]:
                continue
            k0 = (kb * GROUP + ul) * P
            kr = min(P, sk - k0)
            secs = touch_kb[ul]
            first, last = secs[0] == si, secs[-1] == si
            if first and last:
                nisa.activation(dst=out_t[:kr, ul, :], op=nl.copy, data=ps[:kr, ul, :], scale=sc)
                nisa.dma_copy(dst=dst[k0 : k0 + kr, :], src=out_t[:kr, ul, :])
                continue
            acc = scratch[w]
            if first:
                nisa.tensor_copy(dst=cur[:kr, ul, :], src=ps[:kr, ul, :], engine=nisa.engine.scalar)
            else:
                nisa.dma_copy(dst=cur[:kr, ul, :], src=acc[k0 : k0 + kr, :])
                nisa.tensor_tensor(
                    dst=cur[:kr, ul, :], data1=cur[:kr, ul, :], data2=ps[:kr, ul, :], op=nl.add
                )
            if last:
                nisa.activation(dst=out_t[:kr, ul, :], op=nl.copy, data=cur[:kr, ul, :], scale=sc)
                nisa.dma_copy(dst=dst[k0 : k0 + kr, :], src=out_t[:kr, ul, :])
            else:
                nisa.dma_copy(dst=acc[k0 : k0 + kr, :], src=cur[:kr, ul, :])


__all__ = ["flash_attention_bwd"]
