"""Decode attention streamed for HBM bandwidth: the whole batch in one launch, keys on
partitions, K and V the stationary matmul operands.

Work items: a tile of `nseq` sequences x `nh` KV heads (NGR = nseq * nh * R packed
columns, R = (Hq / Hkv) * Sq query rows per KV head) and a key split; each item streams
its slabs, then (with `tail`) one tail slab. A slab holds 128 "pieces" of C consecutive
keys per sequence, gathered by one indirect DMA per operand (the host's piece table:
contiguous caches and both paged layouts are row gathers of the same form):

    K^T slab  [D, heads, C, 128 pieces]   (DMA transposes of the gathered rows, one per head)
    V   slab  [128 pieces, heads, C, D]   (4 KiB+ descriptors: C keys x D per head run)
    per (sequence, head, c):  S^T[:, c, cols] = K^T[:, h, c, :]^T @ Q^T[:, cols]   (PSUM)
    S = select(key_pos[piece, c] < hi[col], S^T, FP32_MIN)      # one pass, whole slab
    m_slab[col] = max over (c, pieces): reduce over c, PE transpose, reduce over pieces
    m' = max(m, m_slab); a = exp(scale (m - m')); broadcast -scale m', a by PE transposes
    P = exp(scale S - scale m')  (bf16);  l = a l + ones^T P     (one matmul per c)
    O^T[:, cols] = a O^T + V[:, h, c, :]^T @ P[:, c, cols]     (V stationary, O^T [D, NGR])
    end of item: O = transpose(O^T) / l, lse = scale m + log l

Every key a query must not see is selected away before the max (K rows past a length
may hold NaN), and every V row that meets a zero weight is real data of the same
sequence: the host fills a slab's unused pieces with a full piece of the sequence
(masked by key_pos), covers a contiguous sequence's last partial piece by the piece that
ends at its length (duplicate keys masked), and gathers what remains (a paged sequence's
partial block, a sequence shorter than C) one key per partition into the zeroed tail
slab (`oob_mode.skip` for unused rows). A sequence with no full piece (length < C) has
only padding pieces in its slabs; `full[col]` = 0 keeps O^T unchanged there (select).
Where masked keys inside the length may hold anything (a sliding window's keys before its
start, all in the first block the serving host keeps: position BIG), `zero_masked_v` = Z
sets the V rows of every key at position BIG in slabs 0 .. Z - 1 to +0.0 before P V (an
AND of the V words with the key's all-ones / zero word, per sequence and slab on
VectorE and GpSimd; the host points later slabs' padding at keys inside the window). The
decode op leaves it 0.

LNC 2: items are shared by the programs (sequences / heads for B >= 2; the key range
split `ksplit` ways for B = 1, merged by the host from the per-split (out, lse)).

Limits: D <= 256 (128-row chunks); NGR <= 128; C * NGR <= 512 (one PSUM bank of scores);
fp32 caches stage K through TensorE transposes (DMA transposes of gathered rows are 2-byte).
"""

from __future__ import annotations

from ..nki import nisa, nki, nl
from ._staging import compute_dtype
from .decode_stream_fp8 import convert_k, convert_v, fp8_buffers, is_fp8, load_k_mult
from .decode_stream_views import gather, kt_at, kt_view, v_at

P = 128
BIG = 3.0e38  # running-max start: finite, so exp(scale (m - m')) is 1 or 0, never NaN
FP32_MIN = -3.4028235e38  # masked scores (below the running-max start)
PSUM_F32 = 512  # fp32 elements per PSUM bank and partition
POS_REAL = 1.0e30  # key positions below this are real keys; masked ones are BIG


@nki.jit
def decode_stream_fwd(
    q, k, v, idx, kpos, tail_idx, tail_kpos, hi, full, softmax_scale,
    layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v=0, k_mult=None,
    v_mult=None, index_queue="sync",
):  # fmt: skip
    """The NKI entry point of `decode_stream_body` (same arguments; see its docstring)."""
    return decode_stream_body(
        q, k, v, idx, kpos, tail_idx, tail_kpos, hi, full, softmax_scale, layout, piece,
        tiles, n_slabs, tail, ksplit, ring, zero_masked_v, k_mult, v_mult, index_queue,
    )  # fmt: skip


def decode_stream_body(
    q, k, v, idx, kpos, tail_idx, tail_kpos, hi, full, softmax_scale,
    layout, piece, tiles, n_slabs, tail, ksplit, ring, zero_masked_v=0, k_mult=None,
    v_mult=None, index_queue="sync",
):  # fmt: skip
    """The streamed decode kernel's body (undecorated: `decode_stream_fwd` and the serving
    kernels trace it inline). out [ksplit, B, Hq, Sq, D] (q.dtype), lse [ksplit, B, Hq, Sq] fp32.

    q [B, Hq, Sq, D]; k, v: [B, Hkv, S, D] (layout "contiguous"), [NB, bs, Hkv, D]
    ("paged", vLLM's) or [NB, Hkv, bs, D] ("paged_hm"). idx uint32 [T, n_slabs, 128,
    nseq]: cache row (see `gather`) of each piece; kpos fp32 [T, n_slabs, 128, nseq, C]:
    each key's position (BIG: masked); tail_idx uint32 [T, R16, nseq] / tail_kpos fp32
    [T, R16, nseq] (R16: C rounded up to 16): one key per row (NO_ROW: none); hi fp32
    [T, NGR]: a column sees keys with position < hi; full uint8 [T, NGR]; tiles:
    ((b0, nseq, h0, nh), ...); zero_masked_v: the leading slabs whose V rows of keys at
    position BIG are set to 0 (see above). FP8 caches (`decode_stream_fp8.py`): k_mult
    fp32 [1, Hkv] multiplies K (softmax_scale * k_scale: pass softmax_scale 1), v_mult
    fp32 [T, NGR] each column's output (v_scale). index_queue "scalar": each slab's piece
    indices and key positions load through ScalarE's hardware DGE queue, not behind the
    gathers on the sync queue (the serving kernel, whose cache write runs first).
    """
    batch, hq, sq, d = q.shape
    hkv = k.shape[2] if layout == "paged" else k.shape[1]
    grp = hq // hkv
    rows = grp * sq
    cdt = compute_dtype(q.dtype)
    fp8 = is_fp8(k.dtype)
    two_byte = cdt != nl.float32 and not fp8  # K^T by DMA transposes of the cache
    out = nl.ndarray((ksplit, batch, hq, sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((ksplit, batch, hq, sq), dtype=nl.float32, buffer=nl.shared_hbm)
    nprog, pid = (nl.num_programs(0), nl.program_id(0)) if nl.program_ndim() != 0 else (1, 0)
    nsq = max([t[1] for t in tiles])
    nhm = max([t[3] for t in tiles])
    ngr = nsq * nhm * rows
    nd = (d + P - 1) // P
    fp32_rows = cdt == nl.float32 and not fp8  # fp32 K: gathered rows, PE transposes
    b = _buffers(d, nd, cdt, piece, nsq, nhm, ngr, ring, fp32_rows, zero_masked_v)
    if fp8:  # raw fp8 rows, converted ring - 1 slabs ahead (each in its own kt / v slot)
        fp8_buffers(b, k.dtype, cdt, d, piece, nsq, nhm, ring, hkv, layout)
        load_k_mult(b, k_mult)
    per = (n_slabs + ksplit - 1) // ksplit
    items = [(t, s) for t in range(len(tiles)) for s in range(ksplit)]
    steps = []
    for no, (t, s) in enumerate(items[pid::nprog]):
        lo, hi_ = s * per, min(n_slabs, (s + 1) * per)
        slabs = list(range(lo, hi_)) + ([-1] if tail and s == ksplit - 1 else [])
        for n, j in enumerate(slabs):
            steps.append((t, s, j, n == 0, n == len(slabs) - 1, no))
    io = {"q": q, "k": k, "v": v, "idx": idx, "kpos": kpos, "tail_idx": tail_idx,
          "tail_kpos": tail_kpos, "hi": hi, "full": full, "layout": layout, "piece": piece,
          "tiles": tiles, "d": d, "nd": nd, "rows": rows, "two_byte": two_byte, "fp8": fp8,
          "v_mult": v_mult, "index_queue": index_queue}  # fmt: skip
    nst = len(steps)
    for i in range(min(ring, nst)):
        _load_k(io, b, steps[i], i % ring, i % (ring + 1))
        _load_v(io, b, steps[i], i % ring, i % (ring + 1))
    ahead = ring - 1  # fp8: slabs converted ahead of their scores (a slot each)
    for i in range(min(ahead, nst) if fp8 else 0):
        convert_v(io, b, steps[i], i % ring)
        convert_k(io, b, steps[i], i % ring)
    for i, (t, s, j, first, last, no) in enumerate(steps):
        _b0, ns, _h0, nh = tiles[t]
        cols = ns * nh * rows
        if first:
            _start_item(b, nd, cols)
        c = piece if j >= 0 else 1
        nparts = P if j >= 0 else piece
        shape = (ns, nh, rows, cols, c, nparts, d, nd, layout)
        slots = (i % ring, i % (ring + 1), i % 2, no % (ring + 1))
        _scores(b, slots, shape)
        # K^T / V slots are reloaded as soon as their last reader is issued: K after the
        # score matmuls, V after P V (the DMA queues run ahead of the softmax chain)
        if i + ring < nst:
            _load_k(io, b, steps[i + ring], i % ring, (i + ring) % (ring + 1))
        _slab(b, slots, shape, softmax_scale, j >= 0, 0 <= j < zero_masked_v)
        if fp8 and i + ahead < nst:  # after this slab's chain: the engines run in order
            convert_v(io, b, steps[i + ahead], (i + ahead) % ring)
            convert_k(io, b, steps[i + ahead], (i + ahead) % ring)
        if i + ring < nst:
            _load_v(io, b, steps[i + ring], i % ring, (i + ring) % (ring + 1))
        if last:
            vmul = b["vmul"][no % (ring + 1)] if fp8 else None
            _finish_item(out, lse, b, s, tiles[t], grp, rows, cols, d, nd, softmax_scale, vmul)
    return out, lse


def _buffers(d, nd, cdt, piece, nsq, nhm, ngr, ring, fp32_rows, zero_masked_v):
    f32, sb, ps = nl.float32, nl.sbuf, nl.psum
    dp = min(d, P)
    slab = nsq * nhm * piece
    b = {
        "kt": [nl.ndarray((dp, nd * slab * P), dtype=cdt, buffer=sb) for _ in range(ring)],
        "v": [nl.ndarray((P, slab * d), dtype=cdt, buffer=sb) for _ in range(ring)],
        "idx": [nl.ndarray((P, nsq), dtype=nl.uint32, buffer=sb) for _ in range(ring + 1)],
        "kp": [nl.ndarray((P, nsq * piece), dtype=f32, buffer=sb) for _ in range(ring + 1)],
        "qt": [nl.ndarray((dp, nd * ngr), dtype=cdt, buffer=sb) for _ in range(ring + 1)],
        "hi": [nl.ndarray((P, ngr), dtype=f32, buffer=sb) for _ in range(ring + 1)],
        "full": [nl.ndarray((P, ngr), dtype=nl.uint8, buffer=sb) for _ in range(ring + 1)],
        "s_ps": [nl.ndarray((P, PSUM_F32), dtype=f32, buffer=ps) for _ in range(2)],
        "st_ps": nl.ndarray((P, PSUM_F32), dtype=f32, buffer=ps),
        "o_ps": [nl.ndarray((P, nd * ngr), dtype=f32, buffer=ps) for _ in range(2)],
        "fin_ps": nl.ndarray((P, d), dtype=f32, buffer=ps),
        "pred": nl.ndarray((P, PSUM_F32), dtype=nl.uint8, buffer=sb),
        "s": nl.ndarray((P, PSUM_F32), dtype=f32, buffer=sb),
        "z": nl.ndarray((P, PSUM_F32), dtype=f32, buffer=sb),
        "p": [nl.ndarray((P, PSUM_F32), dtype=cdt, buffer=sb) for _ in range(2)],
        "mx": nl.ndarray((P, ngr), dtype=f32, buffer=sb),
        "o": nl.ndarray((dp, nd * ngr), dtype=f32, buffer=sb),
        "tmp": nl.ndarray((dp, nd * ngr), dtype=f32, buffer=sb),
        "ones": nl.ndarray((P, 1), dtype=f32, buffer=sb),
        "p32": nl.ndarray((P, PSUM_F32), dtype=f32, buffer=sb),
        "out": nl.ndarray((P, d), dtype=cdt, buffer=sb),
        "lse": nl.ndarray((P, 1), dtype=f32, buffer=sb),
    }
    for name in ("m", "l", "mn", "cm", "nb", "a", "lg", "rl"):
        b[name] = nl.ndarray((P, 1), dtype=f32, buffer=sb)
    if fp32_rows:  # fp32 K: gathered rows, transposed on TensorE
        b["kraw"] = [nl.ndarray((P, slab * nd * P), dtype=f32, buffer=sb) for _ in range(ring)]
        b["tp_ps"] = nl.ndarray((P, PSUM_F32), dtype=f32, buffer=ps)
    if zero_masked_v > 0:  # per (piece, key): -1 (all ones) where the key is real, else 0
        # 32-bit words where a key's head row is whole words, else 16-bit
        word = nl.int32 if cdt == nl.float32 or d % 2 == 0 else nl.int16
        b["vkeep"] = nl.ndarray((P, nsq * piece), dtype=word, buffer=sb)
    nisa.memset(dst=b["ones"], value=1.0)
    b["nd"] = nd
    return b


def _load_k(io, b, step, slot, islot):
    """Gather step's piece rows, key positions and K^T into K slot `slot` (an item's
    slabs one DMA per head, as an indirect transpose of a 4-D source needs dim 1 or 2 of
    size 1; the tail's one-key pieces one DMA for all heads)."""
    k, idx, kpos, tail_idx, tail_kpos, layout, piece, tiles, d, nd, two_byte = (
        io["k"],
        io["idx"],
        io["kpos"],
        io["tail_idx"],
        io["tail_kpos"],
        io["layout"],
        io["piece"],
        io["tiles"],
        io["d"],
        io["nd"],
        io["two_byte"],
    )
    t, _, j, first, _, no = step
    if first:
        _load_item(io, b, t, no % (len(b["qt"])))
    _b0, ns, h0, nh = tiles[t]
    nsq = idx.shape[3]
    hkv = k.shape[2] if layout == "paged" else k.shape[1]
    # the tail scores `piece` rows but gathers ng >= piece (a multiple of 16, as an
    # indirect DMA transpose needs), its rows past the keys skipped (NO_ROW)
    c, ng = (piece, P) if j >= 0 else (1, tail_idx.shape[1])
    ix, kp = b["idx"][islot], b["kp"][islot]
    if j >= 0:
        _load_index(ix[:, :nsq], idx[t, j], io["index_queue"])
        _load_index(kp[:, : nsq * c], kpos[t, j].reshape((P, nsq * c)), io["index_queue"])
    else:  # tail: zero first, so skipped rows hold 0 (finite), not another step's keys
        _load_index(ix[:ng, :nsq], tail_idx[t], io["index_queue"])
        _load_index(kp[:ng, :nsq], tail_kpos[t], io["index_queue"])
        if not two_byte and not io["fp8"]:
            kraw = b["kraw"][slot][:ng, : ns * nd * nh * P]
            nisa.memset(dst=kraw, value=0.0, engine=nisa.engine.gpsimd)
    if io["fp8"]:  # the rows as they lie, as V's (converted and transposed later)
        _load_rows(io, b, step, slot, islot, io["k"], "kraw")
        return
    skip = nisa.oob_mode.skip if j < 0 else nisa.oob_mode.error
    for sl in range(ns):
        col = ix[:ng, sl : sl + 1]
        for dci in range(nd):
            d0, dc = dci * P, min(P, d - dci * P)
            view = kt_view(b, slot, dci, sl, nh, c, dc)[:, :, :, :ng]
            if j < 0:  # only the columns the tail's score matmuls read
                nisa.memset(dst=view, value=0.0, engine=nisa.engine.gpsimd)
            # an indirect transpose of a 4-D source needs its dim 1 or 2 of size 1: one per
            # head unless a piece is one key (the tail) or the tile has one head
            if two_byte and (first or (nh > 1 and c > 1)):
                for h in range(nh):
                    src = gather(k, col, layout, hkv, h0 + h, 1, c, d0, dc, False)
                    nisa.dma_transpose(
                        dst=view[:, h : h + 1].reshape(_transposed(src.shape)), src=src,
                        oob_mode=skip,
                    )  # fmt: skip
            elif two_byte:
                src = gather(k, col, layout, hkv, h0, nh, c, d0, dc, False)
                dst = view.permute((0, 2, 1, 3)) if layout == "paged" else view
                nisa.dma_transpose(dst=dst, src=src, oob_mode=skip)
            else:
                src = gather(k, col, layout, hkv, h0, nh, c, d0, dc, False)
                _kt_fp32(b, slot, dci, sl, nh, c, ng, d0, dc, layout, src, skip)


def _load_index(dst, src, queue):
    """A slab's small index / position load: on the sync queue (in order with the
    gathers), or through ScalarE's hardware DGE ("scalar": it does not wait behind them)."""
    if queue == "scalar":
        nisa.dma_copy(dst=dst, src=src, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)
    else:
        nisa.dma_copy(dst=dst, src=src)


def _load_v(io, b, step, slot, islot):
    """Gather step's V (one DMA per sequence: its heads' keys are contiguous runs)."""
    _load_rows(io, b, step, slot, islot, io["v"], "vraw" if io["fp8"] else "v")


def _load_rows(io, b, step, slot, islot, cache, ring_name):
    """Gather step's rows of `cache` into ring `ring_name`, slot `slot` (V's layout)."""
    k, layout, piece, tiles, d = io["k"], io["layout"], io["piece"], io["tiles"], io["d"]
    t, _, j, _, _, _ = step
    _b0, ns, h0, nh = tiles[t]
    hkv = k.shape[2] if layout == "paged" else k.shape[1]
    c, n = (piece, P) if j >= 0 else (1, io["tail_idx"].shape[1])
    ix = b["idx"][islot]
    if j < 0:
        nisa.memset(dst=b[ring_name][slot][:n, : ns * nh * d], value=0.0,
                    engine=nisa.engine.gpsimd)  # fmt: skip
    skip = nisa.oob_mode.skip if j < 0 else nisa.oob_mode.error
    # one DMA per head where a head's keys are one run (contiguous / head-major blocks), so
    # P V starts on the first heads while the last ones land
    per_head = layout != "paged" and j >= 0
    for sl in range(ns):
        col = ix[:n, sl : sl + 1]
        base = sl * nh * c * d
        for h0_, nh_ in [(h, 1) for h in range(nh)] if per_head else [(0, nh)]:
            vsrc = gather(cache, col, layout, hkv, h0 + h0_, nh_, c, 0, d, True)
            vdst = b[ring_name][slot][:n, base + h0_ * c * d : base + (h0_ + nh_) * c * d]
            nisa.dma_copy(dst=vdst.reshape(vsrc.shape), src=vsrc, oob_mode=skip)


def _kt_fp32(b, slot, dci, sl, nh, c, n, d0, dc, layout, src, skip):
    """fp32 K^T: gather the rows, then one PE transpose per (head, c), 4 per PSUM bank."""
    raw = b["kraw"][slot]
    width = src.shape[3]
    base = (sl * b["nd"] + dci) * nh * c * P
    rview = raw[:n, base : base + nh * c * width].reshape(src.shape)
    nisa.dma_copy(dst=rview, src=src, oob_mode=skip)
    pairs = [(h, ci) for h in range(nh) for ci in range(c)]
    kview = kt_view(b, slot, dci, sl, nh, c, dc)
    tp = b["tp_ps"]
    for g0 in range(0, len(pairs), 4):
        grp = pairs[g0 : g0 + 4]
        for u, (h, ci) in enumerate(grp):
            rows = rview[:n, ci, h, :dc] if layout == "paged" else rview[:n, h, ci, :dc]
            nisa.nc_transpose(dst=tp[:dc, u * P : u * P + n], data=rows)
        for u, (h, ci) in enumerate(grp):
            nisa.tensor_copy(dst=kview[:, h, ci, :n], src=tp[:dc, u * P : u * P + n])


def _transposed(shape):
    return (shape[3], shape[1], shape[2], shape[0])


def _load_item(io, b, t, par):
    """Q^T of the item's columns and their hi / full rows broadcast to the partitions
    (prefetched with the item's first K slab: ring + 1 slots, as up to `ring` items
    ahead are in flight with the running one)."""
    q, tiles, d, nd, rows = io["q"], io["tiles"], io["d"], io["nd"], io["rows"]
    hi, full = io["hi"], io["full"]
    b0, ns, h0, nh = tiles[t]
    cols = ns * nh * rows
    grp = rows // q.shape[2]
    qt = b["qt"][par]
    for sl in range(ns):
        qrows = q[b0 + sl, h0 * grp : (h0 + nh) * grp].reshape((nh * rows, d))
        c0 = sl * nh * rows
        for dci in range(nd):
            d0, dc = dci * P, min(P, d - dci * P)
            nisa.dma_transpose(
                dst=qt[:dc, dci * cols + c0 : dci * cols + c0 + nh * rows],
                src=qrows[:, d0 : d0 + dc],
            )
    nisa.dma_copy(dst=b["hi"][par][:, :cols], src=hi[t, :cols].reshape((1, cols)).broadcast(0, P))
    nisa.dma_copy(
        dst=b["full"][par][:, :cols], src=full[t, :cols].reshape((1, cols)).broadcast(0, P)
    )
    if io["fp8"]:  # each column's v_scale, for the item's end
        nisa.dma_copy(dst=b["vmul"][par][:cols, :], src=io["v_mult"][t, :cols].reshape((cols, 1)))


def _start_item(b, nd, cols):
    nisa.memset(dst=b["m"][:cols, :], value=-BIG)
    nisa.memset(dst=b["l"][:cols, :], value=0.0)
    nisa.memset(dst=b["o"][:, : nd * cols], value=0.0)


def _scores(b, slots, shape):
    """S^T [n keys, c, cols] in PSUM: one matmul per (sequence, head, c, head_dim chunk)."""
    slot, _, par, ipar = slots
    ns, nh, rows, cols, c, n, d, nd, _layout = shape
    s_ps, qt = b["s_ps"][par], b["qt"][ipar]
    for sl in range(ns):
        for h in range(nh):
            col = (sl * nh + h) * rows
            for ci in range(c):
                for dci in range(nd):
                    dc = min(P, d - dci * P)
                    nisa.nc_matmul(
                        dst=s_ps[:n, ci * cols + col : ci * cols + col + rows],
                        stationary=kt_at(b, slot, dci, sl, h, ci, nh, c, n, dc),
                        moving=qt[:dc, dci * cols + col : dci * cols + col + rows],
                        accumulate=dci > 0,
                    )


def _slab(b, slots, shape, scale, main, zero_v):
    """Softmax statistics of the slab's scores, P, row sums, O^T += V^T P."""
    slot, islot, par, ipar = slots
    if zero_v:
        _zero_masked_v(b, slot, islot, shape)
    ns, nh, rows, cols, c, n, d, nd, layout = shape
    width = c * cols
    s_ps, st = b["s_ps"][par], b["st_ps"]
    hiv, full = b["hi"][ipar], b["full"][ipar]
    # select: position < hi[col] (masked keys and other rows' garbage never reach the max)
    kp = b["kp"][islot]
    kpst = kp.shape[1]
    kpv = kp.ap([[kpst, n], [1, c], [c, ns], [0, nh * rows]])
    pred = b["pred"]
    nisa.tensor_tensor(
        dst=pred[:n, :width].reshape((n, c, ns, nh * rows)),
        data1=kpv,
        data2=hiv.ap([[hiv.shape[1], n], [0, c], [nh * rows, ns], [1, nh * rows]]),
        op=nl.less,
    )
    s_sb = b["s"]
    nisa.select_reduce(
        dst=s_sb[:n, :width], predicate=pred[:n, :width], on_true=s_ps[:n, :width],
        on_false=FP32_MIN,
    )  # fmt: skip
    mx = b["mx"]
    if c > 1:
        nisa.tensor_reduce(
            dst=mx[:n, :cols],
            op=nl.maximum,
            data=s_sb.ap([[s_sb.shape[1], n], [1, cols], [cols, c]]),
            axis=(2,),
        )
    else:
        nisa.tensor_copy(dst=mx[:n, :cols], src=s_sb[:n, :cols])
    # column max over the partitions: PE transpose, free-axis reduce
    nisa.nc_transpose(dst=st[:cols, 0:n], data=mx[:n, :cols])
    m, mn, cm, nb, a = b["m"], b["mn"], b["cm"], b["nb"], b["a"]
    nisa.tensor_reduce(dst=cm[:cols, :], op=nl.maximum, data=st[:cols, 0:n], axis=(1,))
    nisa.tensor_tensor(dst=mn[:cols, :], data1=m[:cols, :], data2=cm[:cols, :], op=nl.maximum)
    nisa.activation(dst=nb[:cols, :], op=nl.copy, data=mn[:cols, :], scale=-scale)
    nisa.activation(dst=a[:cols, :], op=nl.exp, data=m[:cols, :], bias=nb[:cols, :], scale=scale)
    nisa.tensor_copy(dst=m[:cols, :], src=mn[:cols, :])
    # -scale m' and a broadcast over the partitions (transposes of stride-0 views)
    nisa.nc_transpose(dst=st[:n, 256 : 256 + cols], data=nb[:cols, 0:1].broadcast(1, n))
    dp = min(d, P)
    nisa.nc_transpose(dst=st[:dp, 384 : 384 + cols], data=a[:cols, 0:1].broadcast(1, dp))
    z, p_sb = b["z"], b["p"][par]
    nisa.scalar_tensor_tensor(
        dst=z[:n, :width].reshape((n, c, cols)),
        data=s_sb[:n, :width].reshape((n, c, cols)),
        op0=nl.multiply,
        operand0=scale,
        op1=nl.add,
        operand1=st.ap([[st.shape[1], n], [0, c], [1, cols]], offset=256),
    )
    # fp32 P for the row sums (lse to fp32 accuracy), the matmul dtype's copy for P V
    p32 = b["p32"]
    nisa.activation(dst=p32[:n, :width], op=nl.exp, data=z[:n, :width])
    if p_sb.dtype != nl.float32:
        nisa.tensor_copy(dst=p_sb[:n, :width], src=p32[:n, :width], engine=nisa.engine.scalar)
    else:
        p_sb = p32
    # row sums on TensorE (keys contracted, fp32), l = a l + sum
    for ci in range(c):
        nisa.nc_matmul(
            dst=st[:cols, 128:129],
            stationary=p32[:n, ci * cols : (ci + 1) * cols],
            moving=b["ones"][:n, 0:1],
            accumulate=ci > 0,
        )
    nisa.scalar_tensor_tensor(
        dst=b["l"][:cols, :], data=b["l"][:cols, :], op0=nl.multiply, operand0=a[:cols, :],
        op1=nl.add, operand1=st[:cols, 128:129],
    )  # fmt: skip
    # O^T += V^T P: V stationary, each head's columns of P moving
    o_ps = b["o_ps"][par]
    for sl in range(ns):
        for h in range(nh):
            col = (sl * nh + h) * rows
            for ci in range(c):
                vv = v_at(b, slot, sl, h, ci, nh, c, n, d, layout)
                for dci in range(nd):
                    d0, dc = dci * P, min(P, d - dci * P)
                    nisa.nc_matmul(
                        dst=o_ps[:dc, dci * cols + col : dci * cols + col + rows],
                        stationary=vv[:, d0 : d0 + dc],
                        moving=p_sb[:n, ci * cols + col : ci * cols + col + rows],
                        accumulate=ci > 0,
                    )
    o, tmp = b["o"], b["tmp"]
    for dci in range(nd):
        dc = min(P, d - dci * P)
        sl_ = slice(dci * cols, (dci + 1) * cols)
        nisa.tensor_tensor(
            dst=tmp[:dc, sl_], data1=o[:dc, sl_], data2=st[:dc, 384 : 384 + cols], op=nl.multiply
        )
        nisa.tensor_tensor(dst=tmp[:dc, sl_], data1=tmp[:dc, sl_], data2=o_ps[:dc, sl_], op=nl.add)
        if main:  # a sequence without a full piece only has padding here: keep O^T
            nisa.tensor_copy_predicated(
                dst=o[:dc, sl_], src=tmp[:dc, sl_], predicate=full[:dc, :cols]
            )
        else:
            nisa.tensor_copy(dst=o[:dc, sl_], src=tmp[:dc, sl_])


def _zero_masked_v(b, slot, islot, shape):
    """V rows of the slab's masked keys (position BIG) set to +0.0: their weight is 0, and
    0 x a non-finite V (a key before a sliding window: vLLM's never-written null block)
    would be NaN in P V. The V words are ANDed with the key's mask word (all ones for a
    real key, 0 for a masked one): exact on integers, NaN bits cleared as a select would."""
    ns, nh, _rows, _cols, c, n, d, _nd, layout = shape
    kp, keep = b["kp"][islot], b["vkeep"]
    # 1 (real) or 0 (masked), times -1: the all-ones / zero word
    nisa.tensor_scalar(dst=keep[:n, : ns * c], data=kp[:n, : ns * c], op0=nl.less,
                       operand0=POS_REAL, op1=nl.multiply, operand1=-1.0)  # fmt: skip
    st = keep.shape[1]
    word = keep.dtype
    vw = b["v"][slot].view(word)
    vbytes = 4 if b["v"][slot].dtype == nl.float32 else 2
    w = d * vbytes // (4 if word == nl.int32 else 2)  # words per key and head
    # per sequence the V slab is [key, head, d] (paged) or [head, key, d]
    # a third on VectorE, the rest on GpSimd: both carry other work (VectorE the softmax
    # chain, GpSimd the indirect DMAs' descriptors); of the splits tried, the one that
    # models fastest over windowed decode in both layouts
    outer = c if layout == "paged" else nh
    inner = nh * w if layout == "paged" else c * w
    split = outer // 3
    parts = [(nisa.engine.vector, 0, split), (nisa.engine.gpsimd, split, outer)]
    for sl in range(ns):
        base = sl * nh * c * w
        for eng, a0, a1 in parts:
            if a1 == a0:
                continue
            if layout == "paged":  # [key, head, d]
                pat = [[st, n], [1, a1 - a0], [0, nh], [0, w]]
                off = sl * c + a0
            else:  # [head, key, d]
                pat = [[st, n], [0, a1 - a0], [1, c], [0, w]]
                off = sl * c
            vs = vw[:n, base + a0 * inner : base + a1 * inner]
            nisa.tensor_tensor(dst=vs, data1=vs, data2=keep.ap(pat, offset=off),
                               op=nl.bitwise_and, engine=eng)  # fmt: skip


def _finish_item(out, lse, b, split, tile, grp, rows, cols, d, nd, scale, vmul):
    b0, ns, h0, nh = tile
    fin = b["fin_ps"]
    for dci in range(nd):
        d0, dc = dci * P, min(P, d - dci * P)
        nisa.nc_transpose(
            dst=fin[:cols, d0 : d0 + dc], data=b["o"][:dc, dci * cols : (dci + 1) * cols]
        )
    lg, rl = b["lg"], b["rl"]
    # an item with no visible key keeps l = 0 and O = 0: out 0, lse ~ scale * -BIG
    nisa.tensor_scalar(dst=lg[:cols, :], data=b["l"][:cols, :], op0=nl.maximum, operand0=1e-30)
    nisa.reciprocal(dst=rl[:cols, :], data=lg[:cols, :])
    if vmul is not None:  # fp8: v_scale folded into the output
        nisa.tensor_tensor(dst=rl[:cols, :], data1=rl[:cols, :], data2=vmul[:cols, :],
                           op=nl.multiply)  # fmt: skip
    nisa.tensor_scalar(
        dst=b["out"][:cols, :d], data=fin[:cols, :d], op0=nl.multiply, operand0=rl[:cols, :]
    )
    nisa.activation(dst=lg[:cols, :], op=nl.log, data=lg[:cols, :])
    nisa.scalar_tensor_tensor(
        dst=b["lse"][:cols, :], data=b["m"][:cols, :], op0=nl.multiply, operand0=scale,
        op1=nl.add, operand1=lg[:cols, :],
    )  # fmt: skip
    for sl in range(ns):
        r0 = sl * nh * rows
        heads = slice(h0 * grp, (h0 + nh) * grp)
        nisa.dma_copy(
            dst=out[split, b0 + sl, heads].reshape((nh * rows, d)),
            src=b["out"][r0 : r0 + nh * rows, :d],
        )
        nisa.dma_copy(
            dst=lse[split, b0 + sl, heads].reshape((nh * rows, 1)),
            src=b["lse"][r0 : r0 + nh * rows, :],
        )


__all__ = ["decode_stream_body", "decode_stream_fwd"]
