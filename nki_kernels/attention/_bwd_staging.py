"""Operand staging of the flash-attention backward (inlined NKI helpers; see flash_bwd.py).

- `make_rings`: the PSUM banks and SBUF buffers rotated by job / block index, and the PSUM
  views carved out of the two auxiliary banks (`tp_view`, `dq_view`, `prep_view`);
- `load_section_stats`, `load_unit`, `stats_product` / `unit_stats`, `prep_item`: a
  section's lse / dlse, a query unit's Q, dO, O (one interleaved DMA each for a full
  unit), its Delta and -lse, and a tile's Q^T / dO^T (PE transposes);
- `load_kv`, `prep_kv`: a key block's K, V rows and K^T, V^T;
- `diag_tiles`: the identity and causal-diagonal bias tiles; `write_zeros`: zero
  gradients of rows and keys no allowed pair touches.
"""

from __future__ import annotations

from ..nki import nisa, nl
from ._bwd_plan import GROUP, UNIT, P
from ._staging import copy_engine, load_kt_group, transpose_kt_group

BANK_F32 = 512  # fp32 elements per partition in one 2 KiB PSUM bank
JOB_RING = 3  # P and dS rotate over 3 jobs (written in stage 2, read in stage 3)
DST_RING = 5  # dS^T rotates over 5 jobs (written in stage 3, read up to 3 jobs later)
DIAG_FILL = -1.0e30  # bias of the keys above the causal diagonal (bf16: exp(s * S) = 0)


def diag_tiles(cdt):
    """An identity [128, 128] and, per tile j of a unit, the bias [128, 512] that is 0 for
    block columns c <= 4p + j and DIAG_FILL above (GpSimd, once per kernel)."""
    ones = nl.ndarray((P, P), dtype=cdt, buffer=nl.sbuf)
    zeros = nl.ndarray((P, UNIT), dtype=cdt, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    nisa.memset(dst=zeros, value=0.0)
    ident = nl.ndarray((P, P), dtype=cdt, buffer=nl.sbuf)
    nisa.affine_select(
        dst=ident,
        pattern=[[-1, P]],
        channel_multiplier=1,
        on_true_tile=ones,
        on_false_value=0.0,
        cmp_op=nl.equal,
    )
    bias = nl.ndarray((P, GROUP, UNIT), dtype=cdt, buffer=nl.sbuf)
    for j in range(GROUP):
        nisa.affine_select(
            dst=bias[:, j, :],
            pattern=[[-1, UNIT]],
            channel_multiplier=GROUP,
            on_true_tile=zeros,
            on_false_value=DIAG_FILL,
            cmp_op=nl.greater_equal,
            offset=j,
        )
    # the same mask with the block's columns in slot order (column 128 j' + p' is key
    # 4 p' + j'), for blocks staged that way
    bias_slots = nl.ndarray((P, GROUP, UNIT), dtype=cdt, buffer=nl.sbuf)
    for j in range(GROUP):
        nisa.affine_select(
            dst=bias_slots[:, j, :],
            pattern=[[-1, GROUP], [-GROUP, P]],
            channel_multiplier=GROUP,
            on_true_tile=zeros,
            on_false_value=DIAG_FILL,
            cmp_op=nl.greater_equal,
            offset=j,
        )
    return {"ident": ident, "bias": bias, "bias_slots": bias_slots}


def write_zeros(ctx, zero_tiles):
    """Query tiles and key slots that no allowed pair touches get zero gradients."""
    sk, d = ctx["sk"], ctx["d"]
    touch = ctx["touch"]
    empty_keys = []
    for kb in range(len(touch)):
        k0 = kb * UNIT
        if k0 + UNIT <= sk:
            if all([len(touch[kb][j]) == 0 for j in range(GROUP)]):
                empty_keys.append((k0, UNIT))
        else:
            for ul in range(GROUP):
                s0 = k0 + ul * P
                if s0 < sk and len(touch[kb][ul]) == 0:
                    empty_keys.append((s0, min(P, sk - s0)))
    if len(zero_tiles) == 0 and len(empty_keys) == 0:
        return
    zeros = nl.ndarray((P, GROUP, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0)
    for h, t, j, il, r0, rows in zero_tiles:
        if il:
            dst = ctx["dq"][h, r0 : r0 + UNIT, :].reshape((P, GROUP, d))[:, j, :]
        else:
            dst = ctx["dq"][h, t * P : t * P + rows, :]
        nisa.dma_copy(dst=dst, src=zeros[:rows, 0, :])
    for s0, n in empty_keys:
        for out in (ctx["dk"], ctx["dv"]):
            if n == UNIT:
                nisa.dma_copy(dst=out[s0 : s0 + n, :].reshape((P, GROUP, d)), src=zeros)
            else:
                nisa.dma_copy(dst=out[s0 : s0 + n, :], src=zeros[:n, 0, :])


def dchunks(d):
    """(chunk, first column, rows) of each 128-row head_dim chunk: Q^T, dO^T, K^T, V^T
    keep D on partitions (at most 128), so S = Q K^T and dP = dO V^T contract in one
    accumulating pass per chunk."""
    return [(c, c * P, min(P, d - c * P)) for c in range((d + P - 1) // P)]


def score_buffers(d):
    """PSUM buffers of S and of dP: 2 (job i + 1's scores overlap job i's softmax) for
    D <= 128; 1 beyond, where dK and dV take 2 banks each ([128, 4 slots, D] fp32 is
    4 KiB per partition at D = 256), so that S, dP (2) + dK, dV (4) + the transpose and
    dQ banks (2) are the 8 banks of 2 KiB."""
    return 2 if d <= P else 1


def make_rings(cdt, d, kv_dtype):
    """Buffers rotated by job / block index, so a buffer is rewritten only well after
    its last reader (in-order engines then never wait on write-after-read)."""
    f32, sb, ps = nl.float32, nl.sbuf, nl.psum
    nsb = score_buffers(d)
    dp_, nch = min(d, P), len(dchunks(d))
    r = {
        "s": [nl.ndarray((P, UNIT), dtype=f32, buffer=ps) for _ in range(nsb)],
        "dp": [nl.ndarray((P, UNIT), dtype=f32, buffer=ps) for _ in range(nsb)],
        # D > 128: slots padded to 256 columns, two per bank (a matmul dst must not
        # cross a bank boundary; 129 <= D < 256 unpadded would)
        "dk": nl.ndarray((P, GROUP, d if d <= P else 2 * P), dtype=f32, buffer=ps),
        "dv": nl.ndarray((P, GROUP, d if d <= P else 2 * P), dtype=f32, buffer=ps),
        # bank 0: dS^T / K^T / V^T transposes (2-byte: two job slots); bank 1: dQ (2-byte:
        # two job slots) and the Q^T / dO^T transposes
        "aux": [nl.ndarray((P, BANK_F32), dtype=f32, buffer=ps) for _ in range(2)],
        "p": [nl.ndarray((P, UNIT), dtype=cdt, buffer=sb) for _ in range(JOB_RING)],
        "ds": [nl.ndarray((P, UNIT), dtype=cdt, buffer=sb) for _ in range(JOB_RING)],
        "dst": [nl.ndarray((P, GROUP, P), dtype=cdt, buffer=sb) for _ in range(DST_RING)],
        "kt": [nl.ndarray((dp_, nch, UNIT), dtype=cdt, buffer=sb) for _ in range(2)],
        "vt": [nl.ndarray((dp_, nch, UNIT), dtype=cdt, buffer=sb) for _ in range(2)],
        "blk": [nl.ndarray((P, GROUP, d), dtype=f32, buffer=sb) for _ in range(2)],
        "blk_out": [nl.ndarray((P, GROUP, d), dtype=kv_dtype, buffer=sb) for _ in range(4)],
        "dq_out": [nl.ndarray((P, GROUP, d), dtype=cdt, buffer=sb) for _ in range(2)],
    }
    r["two_byte"] = cdt != f32
    r["wide"] = d > P
    return r


def tp_view(rings, slot, cdt):
    """A [128, 4, 128] cdt view of the transpose bank for job slot `slot`."""
    bank = rings["aux"][0]
    if rings["two_byte"]:
        h = BANK_F32 // 2
        return bank[:, (slot % 2) * h : (slot % 2 + 1) * h].view(cdt).reshape((P, GROUP, P))
    return bank.reshape((P, GROUP, P))


def dq_view(rings, slot, d):
    """dQ of one job in the second auxiliary bank: two job slots of 128 fp32 columns for
    2-byte D <= 128, else one slot of D columns (columns 0..255 at most)."""
    if rings["two_byte"] and not rings["wide"]:
        return rings["aux"][1][:, (slot % 2) * P : (slot % 2) * P + d]
    return rings["aux"][1][:, 0:d]


def prep_view(rings, slot, cdt):
    """A [128, 2, 128] cdt view for the Q^T and dO^T transposes of one tile (one head_dim
    chunk at a time), in columns 256..511 of the second auxiliary bank (fp32 D <= 128:
    128..383), clear of dQ."""
    bank = rings["aux"][1]
    if rings["two_byte"]:
        c0 = 2 * P + (slot % 2) * P
        return bank[:, c0 : c0 + P].view(cdt).reshape((P, 2, P))
    c0 = 2 * P if rings["wide"] else P
    return bank[:, c0 : c0 + 2 * P].reshape((P, 2, P))


def load_section_stats(units, ctx):
    """A section's buffers and its lse / dlse loads (one DMA per run of consecutive query
    tiles of one head: a contiguous run of floats per partition)."""
    lse, dlse = ctx["ins"][5], ctx["ins"][6]
    n = GROUP * len(units)
    lse_c = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    dlse_c = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf) if dlse is not None else None
    tiles = []
    for pos, unit in enumerate(units):
        for j in range(unit["ntiles"]):
            tiles.append((GROUP * pos + j, unit["h"], unit["r0"] // P + j))
    a = 0
    while a < len(tiles):
        e = a + 1
        while e < len(tiles) and _next_tile(tiles[e - 1], tiles[e]):
            e += 1
        x0, h, t0 = tiles[a]
        cnt = e - a
        nisa.dma_copy(dst=lse_c[:, x0 : x0 + cnt], src=lse[ctx["b"], h, :, t0 : t0 + cnt])
        if dlse_c is not None:
            nisa.dma_copy(dst=dlse_c[:, x0 : x0 + cnt], src=dlse[ctx["b"], h, :, t0 : t0 + cnt])
        a = e
    for pos, unit in enumerate(units):
        unit["x0"] = GROUP * pos
    return {"units": units, "lse": lse_c, "dlse": dlse_c, "ctx": ctx}


def _next_tile(prev, cur):
    return cur[1] == prev[1] and cur[0] == prev[0] + 1 and cur[2] == prev[2] + 1


def load_unit(unit, ctx):
    """DMA Q, dO, O of a unit: one interleaved [128, 4, D] DMA each for a full unit."""
    q, o, do = ctx["ins"][0], ctx["ins"][3], ctx["ins"][4]
    b, d, cdt, sq = ctx["b"], ctx["d"], ctx["cdt"], ctx["sq"]
    h, r0 = unit["h"], unit["r0"]
    bufs = {}
    for name, src in (("q", q), ("do", do), ("o", o)):
        buf = nl.ndarray((P, GROUP, d), dtype=cdt, buffer=nl.sbuf)
        if unit["il"]:
            nisa.dma_copy(dst=buf, src=src[b, h, r0 : r0 + UNIT, :].reshape((P, GROUP, d)))
        else:
            n = sq - r0
            full = n // P
            if full > 0:
                view = src[b, h, r0 : r0 + full * P, :].reshape((full, P, d)).permute((1, 0, 2))
                nisa.dma_copy(dst=buf[:, 0:full, :], src=view)
            if n > full * P:
                rest = n - full * P
                nisa.dma_copy(dst=buf[:rest, full, :], src=src[b, h, r0 + full * P : sq, :])
        bufs[name] = buf
    unit.update(bufs)
    unit["delta"] = None


def _unit_parts(unit, ctx):
    """(first tile, end tile, rows) pieces of a unit for its row-wise statistics."""
    nt, r0, sq = unit["ntiles"], unit["r0"], ctx["sq"]
    if unit["il"]:
        return [(0, nt, P)]
    return [(j, j + 1, min(P, sq - r0 - j * P)) for j in range(nt)]


def stats_product(unit, ctx):
    """dO * O of a unit (GpSimd), the first half of its statistics."""
    if "prod" in unit or unit["delta"] is not None:
        return
    prod = nl.ndarray((P, GROUP, ctx["d"]), dtype=nl.float32, buffer=nl.sbuf)
    for j0, j1, rows in _unit_parts(unit, ctx):
        nisa.tensor_tensor(
            dst=prod[:rows, j0:j1, :],
            data1=unit["do"][:rows, j0:j1, :],
            data2=unit["o"][:rows, j0:j1, :],
            op=nl.multiply,
            engine=nisa.engine.gpsimd,
        )
    unit["prod"], unit["o"] = prod, None


def unit_stats(unit, staged, ctx):
    """Delta = rowsum(dO * O) - dlse and -lse of a unit's tiles (O is dropped after)."""
    if unit["delta"] is not None:
        return
    stats_product(unit, ctx)
    x0, prod = unit["x0"], unit["prod"]
    delta = nl.ndarray((P, GROUP), dtype=nl.float32, buffer=nl.sbuf)
    nlse = nl.ndarray((P, GROUP), dtype=nl.float32, buffer=nl.sbuf)
    for j0, j1, rows in _unit_parts(unit, ctx):
        nisa.tensor_reduce(dst=delta[:rows, j0:j1], op=nl.add, data=prod[:rows, j0:j1, :], axis=2)
        if staged["dlse"] is not None:
            nisa.tensor_tensor(
                dst=delta[:rows, j0:j1],
                data1=delta[:rows, j0:j1],
                data2=staged["dlse"][:rows, x0 + j0 : x0 + j1],
                op=nl.subtract,
                engine=nisa.engine.gpsimd,
            )
        nisa.tensor_scalar(
            dst=nlse[:rows, j0:j1],
            data=staged["lse"][:rows, x0 + j0 : x0 + j1],
            op0=nl.multiply,
            operand0=-1.0,
            engine=nisa.engine.gpsimd,
        )
    unit["delta"], unit["nlse"], unit["prod"] = delta, nlse, None


def prep_item(it, unit, staged, ctx):
    """Q^T and dO^T of one query tile (PE transposes into the prep slots of PSUM)."""
    if it.get("prepped"):
        return
    it["prepped"] = True
    unit_stats(unit, staged, ctx)
    d, cdt = ctx["d"], ctx["cdt"]
    chunks = dchunks(d)
    if "qt" not in unit:
        shape = (min(d, P), len(chunks), GROUP, P)
        unit["qt"] = nl.ndarray(shape, dtype=cdt, buffer=nl.sbuf)
        unit["dot"] = nl.ndarray(shape, dtype=cdt, buffer=nl.sbuf)
        unit["dq_acc"] = nl.ndarray((P, GROUP, d), dtype=nl.float32, buffer=nl.sbuf)
        unit["left"] = len(unit["items"])
    c = ctx["counters"]
    rows, j = it["rows"], it["j"]
    for ch, c0, dc in chunks:
        tp = prep_view(ctx["rings"], c["prep"], cdt)
        c["prep"] += 1
        qt, dot = unit["qt"][:dc, ch, j, :rows], unit["dot"][:dc, ch, j, :rows]
        nisa.nc_transpose(dst=tp[:dc, 0, :rows], data=unit["q"][:rows, j, c0 : c0 + dc])
        nisa.nc_transpose(dst=tp[:dc, 1, :rows], data=unit["do"][:rows, j, c0 : c0 + dc])
        nisa.tensor_copy(dst=qt, src=tp[:dc, 0, :rows], engine=copy_engine(True))
        nisa.tensor_copy(dst=dot, src=tp[:dc, 1, :rows], engine=copy_engine(False))


def load_kv(ctx, kb, slot):
    """DMA the K and V rows of key block kb (interleaved when the block is full)."""
    k, v = ctx["ins"][1], ctx["ins"][2]
    b, g, sk, d, cdt = ctx["b"], ctx["g"], ctx["sk"], ctx["d"], ctx["cdt"]
    k0 = kb * UNIT
    n = min(UNIT, sk - k0)
    if n == UNIT:
        # fresh tiles: the previous block's dQ matmuls may still be unissued
        k_raw = nl.ndarray((P, GROUP, d), dtype=cdt, buffer=nl.sbuf)
        v_raw = nl.ndarray((P, GROUP, d), dtype=cdt, buffer=nl.sbuf)
        nisa.dma_copy(dst=k_raw, src=k[b, g][k0 : k0 + n, :].reshape((P, GROUP, d)))
        nisa.dma_copy(dst=v_raw, src=v[b, g][k0 : k0 + n, :].reshape((P, GROUP, d)))
    else:
        k_raw = load_kt_group(k[b, g], k0, n, d, cdt)
        v_raw = load_kt_group(v[b, g], k0, n, d, cdt)
    return {"k_raw": k_raw, "v_raw": v_raw, "n": n, "slot": slot, "kb": kb}


def prep_kv(kv, ctx, slot_order):
    """K^T and V^T of the block through PE transposes: columns in natural key order, or
    with `slot_order` (a full block) in slot order, column 128 j + p being key 4 p + j."""
    rings, cdt, d, n = ctx["rings"], ctx["cdt"], ctx["d"], kv["n"]
    kt, vt = rings["kt"][kv["slot"] % 2], rings["vt"][kv["slot"] % 2]
    for raw, dst, w in ((kv["k_raw"], kt, 0), (kv["v_raw"], vt, 1)):
        tp = tp_view(rings, w, cdt)
        for ch, c0, dc in dchunks(d):
            part = raw[:, :, c0 : c0 + dc]
            if slot_order:
                for j in range(GROUP):
                    nisa.nc_transpose(dst=tp[:dc, j, :], data=part[:, j, :])
                nisa.tensor_copy(
                    dst=dst[:dc, ch, 0:UNIT].reshape((dc, GROUP, P)),
                    src=tp[:dc, :, :],
                    engine=copy_engine(w == 0),
                )
            else:
                transpose_kt_group(part, dst[:, ch, :], 0, n, dc, cdt, w == 0, tp=tp)
    kv["kt"], kv["vt"] = kt, vt


__all__ = [
    "DST_RING",
    "JOB_RING",
    "dchunks",
    "diag_tiles",
    "dq_view",
    "load_kv",
    "load_section_stats",
    "load_unit",
    "make_rings",
    "prep_item",
    "prep_kv",
    "prep_view",
    "score_buffers",
    "stats_product",
    "tp_view",
    "unit_stats",
    "write_zeros",
]
