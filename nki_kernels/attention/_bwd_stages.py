"""Job stages of the flash-attention backward (inlined NKI helpers; see flash_bwd.py for
the pipeline that issues them): stage 1 the scores S and dP (TensorE), stage 2 the
masks, P and dS, stage 3 dV / dK accumulation and the dS^T transposes, stage 4 dQ.
"""

from __future__ import annotations

from ..nki import nisa, nl
from ._bwd_plan import DIAG, GROUP, SELECT, UNIT, P, runs
from ._bwd_staging import DST_RING, JOB_RING, dchunks, dq_view, tp_view
from ._staging import copy_engine

FP32_MIN = -3.4028235e38  # the fill value range_select requires (hardware constraint)
_IDLE = nisa.reduce_cmd.idle


def _col_view(t, rows, ul, kr, il, slot_order):
    """Score columns of slot ul: keys k0 + 4p + ul (interleaved: a contiguous range in
    slot order, else every 4th column) or ul*128 + p."""
    if slot_order:
        return t[:rows, ul * P : ul * P + P]
    if il:
        return t[:rows, 0:UNIT].reshape((rows, P, GROUP))[:, :, ul]
    return t[:rows, ul * P : ul * P + kr]


def _cols(ul, u, cnt, sk):
    return ul * P, min(cnt * P, sk - u * P)


def stage_scores(job, kv, ctx):
    """TensorE: S = Q K^T and dP = dO V^T for the job's score columns."""
    unit, it, i = job["unit"], job["it"], job["i"]
    rows, j, d, sk = it["rows"], it["j"], ctx["d"], ctx["sk"]
    rings = ctx["rings"]
    s_ps, dp_ps = _score_banks(rings, i)
    for ul, u, cnt, _ in runs(job["w"]["subs"]):
        c0, nc = _cols(ul, u, cnt, sk)
        for dst, lhs, rhs in ((s_ps, unit["qt"], kv["kt"]), (dp_ps, unit["dot"], kv["vt"])):
            for ch, _, dc in dchunks(d):
                nisa.nc_matmul(
                    dst=dst[:rows, c0 : c0 + nc],
                    stationary=lhs[:dc, ch, j, :rows],
                    moving=rhs[:dc, ch, c0 : c0 + nc],
                    accumulate=ch > 0,
                )
    if "mk" in rings:
        _load_dense(job, ctx)
    bias = "bias_slots" if job["slot_order"] else "bias"
    for ul, u, cnt, kind in runs(job["w"]["subs"], split_masked=True):
        if kind == DIAG:
            c0, nc = _cols(ul, u, cnt, sk)
            nisa.nc_matmul(
                dst=s_ps[:rows, c0 : c0 + nc],
                stationary=ctx["diag"]["ident"][:rows, :rows],
                moving=ctx["diag"][bias][:rows, j, c0 : c0 + nc],
                accumulate=True,
            )


def _score_banks(rings, i):
    """The S and dP PSUM buffers of job i (rotating over however many there are)."""
    n = len(rings["s"])
    return rings["s"][i % n], rings["dp"][i % n]


def _load_dense(job, ctx):
    """DMA the dense mask (and bias) of the job's SELECT runs into ring slot i % 3."""
    it, i, sk = job["it"], job["i"], ctx["sk"]
    mask, bias = ctx["dense"]
    rows, r0 = it["rows"], it["t"] * P
    mb = ctx["b"] if mask.shape[0] > 1 else 0
    mh = it["h"] if mask.shape[1] > 1 else 0
    for ul, u, cnt, kind in runs(job["w"]["subs"], split_masked=True):
        if kind != SELECT:
            continue
        c0, nc = _cols(ul, u, cnt, sk)
        src = (mb, mh, slice(r0, r0 + rows), slice(u * P, u * P + nc))
        nisa.dma_copy(dst=ctx["rings"]["mk"][i % 3][:rows, c0 : c0 + nc], src=mask[src])
        if bias is not None:
            nisa.dma_copy(dst=ctx["rings"]["bs"][i % 3][:rows, c0 : c0 + nc], src=bias[src])


def stage_softmax(job, ctx):
    """Mask partial runs, P = exp(s * S - lse) (ScalarE), dS = P * (dP - Delta) (VectorE)."""
    unit, it, i = job["unit"], job["it"], job["i"]
    rows, j, t, sk = it["rows"], it["j"], it["t"], ctx["sk"]
    rings, bnd = ctx["rings"], ctx["bnd"]
    s_ps, dp_ps = _score_banks(rings, i)
    p_sb, ds_sb = rings["p"][i % JOB_RING], rings["ds"][i % JOB_RING]
    cap = ctx["softcap"]
    for ul, u, cnt, kind in runs(job["w"]["subs"], split_masked=True):
        c0, nc = _cols(ul, u, cnt, sk)
        s_view = s_ps[:rows, c0 : c0 + nc]
        if cap is not None:
            w = rings["w"][i % 2][:rows, c0 : c0 + nc]
            nisa.activation(dst=s_view, op=nl.tanh, data=s_view, scale=ctx["cfg"][0] / cap)
            nisa.activation(dst=w, op=nl.square, data=s_view)
        if kind == SELECT and "mk" in rings:
            mk = rings["mk"][i % 3][:rows, c0 : c0 + nc]
            nisa.select_reduce(
                dst=s_view, predicate=mk, on_true=s_view, on_false=FP32_MIN, reduce_cmd=_IDLE
            )
            if "bs" in rings:
                bs = rings["bs"][i % 3][:rows, c0 : c0 + nc]
                nisa.tensor_tensor(dst=s_view, data1=s_view, data2=bs, op=nl.add)
        elif kind == SELECT:
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
            bias=unit["nlse"][:rows, j : j + 1],
            scale=ctx["cfg"][0] if cap is None else cap,
        )
        p_eff = p_sb[:rows, c0 : c0 + nc]
        if cap is not None:  # P * (1 - tanh^2), kept in fp32
            nisa.scalar_tensor_tensor(
                dst=w,
                data=w,
                op0=nl.subtract,
                operand0=1.0,
                reverse0=True,
                op1=nl.multiply,
                operand1=p_eff,
            )
            p_eff = w
        nisa.scalar_tensor_tensor(
            dst=ds_sb[:rows, c0 : c0 + nc],
            data=dp_ps[:rows, c0 : c0 + nc],
            op0=nl.subtract,
            operand0=unit["delta"][:rows, j : j + 1],
            op1=nl.multiply,
            operand1=p_eff,
        )


def stage_grads(job, ctx):
    """dV += P^T dO, dK += dS^T Q (PSUM accumulation), dS^T by PE or DMA transposes."""
    dma_quarters, scalar_evac = ctx["cfg"][2], ctx["cfg"][3]
    unit, it, i = job["unit"], job["it"], job["i"]
    rows, j, d, cdt = it["rows"], it["j"], ctx["d"], ctx["cdt"]
    rings = ctx["rings"]
    written = job["written"]
    p_sb, ds_sb = rings["p"][i % JOB_RING], rings["ds"][i % JOB_RING]
    slots = job["w"]["slots"]
    for ul, kr, il in slots:
        nisa.nc_matmul(
            dst=rings["dv"][:kr, ul, :d],
            stationary=_col_view(p_sb, rows, ul, kr, il, job["slot_order"]),
            moving=unit["do"][:rows, j, :d],
            accumulate=written[ul],
        )
        nisa.nc_matmul(
            dst=rings["dk"][:kr, ul, :d],
            stationary=_col_view(ds_sb, rows, ul, kr, il, job["slot_order"]),
            moving=unit["q"][:rows, j, :d],
            accumulate=written[ul],
        )
        written[ul] = True
    dst_sb = rings["dst"][i % DST_RING]
    full = all([kr == P for _, kr, _ in slots])
    contiguous = all([slots[x + 1][0] == slots[x][0] + 1 for x in range(len(slots) - 1)])
    n_dma = 0
    if rings["two_byte"] and full and contiguous:
        n_dma = min(dma_quarters, len(slots))
    pe = slots[: len(slots) - n_dma]
    if len(pe) > 0:
        tp = tp_view(rings, i, cdt)
        for ul, kr, il in pe:
            nisa.nc_transpose(
                dst=tp[:kr, ul, :rows], data=_col_view(ds_sb, rows, ul, kr, il, job["slot_order"])
            )
        n_s = (len(pe) * scalar_evac + 4) // 8
        for on_scalar, part in ((True, pe[:n_s]), (False, pe[n_s:])):
            if len(part) == 0:
                continue
            u0, u1 = part[0][0], part[-1][0] + 1
            if all([kr == P for _, kr, _ in part]) and u1 - u0 == len(part):
                nisa.tensor_copy(
                    dst=dst_sb[:, u0:u1, :rows],
                    src=tp[:, u0:u1, :rows],
                    engine=copy_engine(on_scalar),
                )
                continue
            for ul, kr, _ in part:
                nisa.tensor_copy(
                    dst=dst_sb[:kr, ul, :rows],
                    src=tp[:kr, ul, :rows],
                    engine=copy_engine(on_scalar),
                )
    if n_dma > 0:
        ul0 = slots[len(pe)][0]
        if slots[0][2] and not job["slot_order"]:
            src = ds_sb[:rows, 0:UNIT].reshape((rows, P, GROUP)).permute((0, 2, 1))
            src = src[:, ul0 : ul0 + n_dma, :]
        else:
            src = ds_sb[:rows, ul0 * P : (ul0 + n_dma) * P].reshape((rows, n_dma, P))
        nisa.dma_transpose(dst=dst_sb[:, ul0 : ul0 + n_dma, :rows], src=src, axes=(2, 1, 0))


def stage_dq(job, kv, ctx):
    """dQ_block = dS K over the job's slots (PSUM), accumulated into fp32 SBUF."""
    unit, it, i = job["unit"], job["it"], job["i"]
    rows, j, d = it["rows"], it["j"], ctx["d"]
    rings = ctx["rings"]
    dq_ps = dq_view(rings, i, d)
    dst_sb = rings["dst"][i % DST_RING]
    for a, (ul, kr, _) in enumerate(job["w"]["slots"]):
        nisa.nc_matmul(
            dst=dq_ps[:rows, :d],
            stationary=dst_sb[:kr, ul, :rows],
            moving=kv["k_raw"][:kr, ul, :d],
            accumulate=a > 0,
        )
    acc = unit["dq_acc"][:rows, j, :]
    if it.get("dq_started"):
        nisa.tensor_tensor(dst=acc, data1=acc, data2=dq_ps[:rows, :d], op=nl.add)
    else:
        nisa.activation(dst=acc, op=nl.copy, data=dq_ps[:rows, :d])
        it["dq_started"] = True
