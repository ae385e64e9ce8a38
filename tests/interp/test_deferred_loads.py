"""The replay's last resorts before an SBUF overflow (liveness.py "Deferred fills and
loads", packing.py): a fill or load whose tile is first read much later counts from
that read, as the compiler's scheduler may reorder instructions with no data dependency;
then the tiles are packed with every live range known, as the compiler allocates after
tracing. Neither accepts tiles that are needed at the same time beyond SBUF."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.interp import MemoryPlanError, nisa, nl, run
from nki_kernels.targets import get_target

P = 128
COLS = 512  # fp32: 2 KiB per partition per tile
N_W = 3  # weight tiles


def _small_sbuf(nbytes: int):
    """trn2 with `nbytes` of usable SBUF per partition."""
    t = get_target("trn2")
    return t.replace(sbuf_bytes_per_partition=t.sbuf_reserved_bytes + nbytes)


def _block_kernel(mode: str):
    """nki-library moe_cte shard_on_block's pattern, reduced: the block's previous
    output `old` is zero-filled ("fill") or loaded ("load") at the block's start, the
    weights are loaded, every weight is read in two passes (so all are live together),
    and `old` is read only at the end: acc = 2 * sum(w) + old. Variants that pin the
    fill or load where it is: "store" (the load's source is written in between),
    "no_reorder" (the fill is in a `no_reorder` block), "early" (`old` is also read
    between the passes)."""

    def kernel(w, prev):
        out = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.shared_hbm)
        old = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
        if mode in ("fill", "early"):
            nisa.memset(dst=old, value=0.0)
        elif mode == "no_reorder":
            with nl.no_reorder():
                nisa.memset(dst=old, value=0.0)
        elif mode == "load":
            nisa.dma_copy(dst=old, src=prev)
        else:  # "store": load the previous output back from `out`
            nisa.dma_copy(dst=out, src=prev)
            nisa.dma_copy(dst=old, src=out)
        ws = [nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf) for _ in range(N_W)]
        for i, t in enumerate(ws):
            nisa.dma_copy(dst=t, src=w[i])
        acc = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for t in ws:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        if mode == "store":
            nisa.dma_copy(dst=out, src=prev)  # a write to the HBM `old` was loaded from
        if mode == "early":
            nisa.tensor_tensor(dst=acc, data1=acc, data2=old, op=nl.add)
        for t in ws:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        if mode != "early":
            nisa.tensor_tensor(dst=acc, data1=acc, data2=old, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    return kernel


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N_W, P, COLS)).astype(np.float32)
    prev = rng.standard_normal((P, COLS)).astype(np.float32)
    return w, prev


# the weights, the accumulator and `old`: 5 tiles of 2 KiB; 4 fit
FOUR_TILES = 4 * COLS * 4


@pytest.mark.parametrize("mode", ["fill", "load"])
def test_a_fill_or_load_read_only_at_the_end_plans_deferred_to_its_read(mode):
    w, prev = _inputs()
    res = run(_block_kernel(mode), w, prev, target=_small_sbuf(FOUR_TILES))
    want = 2 * w.sum(axis=0) + (prev if mode == "load" else 0)
    np.testing.assert_allclose(res.outputs, want, rtol=1e-5, atol=1e-5)
    assert res.peak_sbuf_bytes <= FOUR_TILES
    # the moved instruction's trace region follows the tile to its place: the fill /
    # load of `old` writes the bytes the final add reads
    instrs = res.trace.instrs
    first = instrs[1] if mode == "load" else instrs[0]
    assert first.opcode == ("dma_copy" if mode == "load" else "memset")
    last_add = [i for i in instrs if i.opcode == "tensor_tensor"][-1]
    assert last_add.reads[1][2:] == first.writes[0][2:]


@pytest.mark.parametrize(
    "mode", ["store", "no_reorder", "early"], ids=["hbm-write", "no-reorder", "read-early"]
)
def test_a_fill_or_load_that_cannot_move_still_overflows_with_the_numbers(mode):
    w, prev = _inputs()
    with pytest.raises(MemoryPlanError) as e:
        run(_block_kernel(mode), w, prev, target=_small_sbuf(FOUR_TILES))
    msg = str(e.value)
    assert e.value.rule == "SBUF_OVERFLOW"
    assert "needs 2048 B per partition but 8192 of 8192 usable B per partition are live" in msg
    assert "fills and loads deferred to their first reader" in msg
    assert "packed with every live range known" in msg
    # the live list names the kernel's lines: `old` (or a weight tile, whichever comes
    # last) finds the weights and the accumulator live
    live = msg.split("; live: ")[1]
    assert "(128, 512) float32 (2048 B each) from test_deferred_loads.py:" in live


def test_a_kernel_that_fits_keeps_its_placement():
    # 5 tiles' worth of SBUF: the Python-lifetime plan fits and is used as it is
    w, prev = _inputs()
    res = run(_block_kernel("fill"), w, prev, target=_small_sbuf(FOUR_TILES + COLS * 4))
    instrs = res.trace.instrs
    assert instrs[0].opcode == "memset" and instrs[0].writes[0][4] == 0  # `old`, first
    assert res.peak_sbuf_bytes == FOUR_TILES + COLS * 4


SMALL = 256  # fp32 columns: 1 KiB per partition


def _fragmenting_kernel(big_cols: int):
    """Eight 1 KiB tiles computed from one source tile; each odd one is read once more
    after the next tile is made, then dies; the even ones are read at the end. Then a
    tile of `big_cols` fp32 columns: 4 KiB fit beside the even ones in total, but placed
    online (next-fit or first-fit) they leave no 4 KiB hole."""

    def kernel(x):
        out = nl.ndarray((P, SMALL), dtype=nl.float32, buffer=nl.shared_hbm)
        src = nl.ndarray((P, SMALL), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=x[:, 0:SMALL])
        keep = []
        odd = None
        for i in range(8):
            t = nl.ndarray((P, SMALL), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=t, data=src, op0=nl.multiply, operand0=float(i + 1))
            if odd is not None:
                nisa.tensor_scalar(dst=odd, data=odd, op0=nl.multiply, operand0=2.0)
                odd = None
            if i % 2:
                odd = t
            else:
                keep.append(t)
        nisa.tensor_scalar(dst=odd, data=odd, op0=nl.multiply, operand0=2.0)
        odd = None
        big = nl.ndarray((P, big_cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=big, src=x[:, 0:big_cols])
        acc = keep[0]
        nisa.tensor_tensor(dst=acc, data1=acc, data2=big[:, 0:SMALL], op=nl.add)
        for t in keep[1:]:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    return kernel


def test_tiles_that_fragment_sbuf_online_fit_packed_with_their_live_ranges():
    x = np.random.default_rng(1).standard_normal((P, 4 * SMALL + 16)).astype(np.float32)
    res = run(_fragmenting_kernel(4 * SMALL), x, target=_small_sbuf(8 * 1024))
    np.testing.assert_allclose(res.outputs, 17 * x[:, 0:SMALL], rtol=1e-5, atol=1e-5)
    assert res.peak_sbuf_bytes == 8 * 1024


def test_one_granule_more_than_sbuf_holds_is_still_an_overflow():
    x = np.random.default_rng(1).standard_normal((P, 4 * SMALL + 16)).astype(np.float32)
    with pytest.raises(MemoryPlanError) as e:
        run(_fragmenting_kernel(4 * SMALL + 16), x, target=_small_sbuf(8 * 1024))
    msg = str(e.value)
    assert e.value.rule == "SBUF_OVERFLOW" and "needs 4160 B per partition" in msg
    assert "packed with every live range known" in msg


def _sequencer_kernel(mode: str):
    """`_block_kernel`'s "load" / "fill" pattern with a sequencer instruction between the
    move's start and `old`'s read: "register" -- the load's address reads a register
    (`.ap(scalar_offset=reg)`) that a `register_move` then changes; "loop" -- a device
    loop (`nl.fori_loop`) runs between the zero-fill and the read."""

    def kernel(w, prev2):
        out = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.shared_hbm)
        old = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
        if mode == "register":
            reg = nisa.register_alloc(0)
            src = prev2.ap([[COLS, P], [1, COLS]], scalar_offset=reg, indirect_dim=0)
            nisa.dma_copy(dst=old, src=src)
            nisa.register_move(reg, 1)  # the load read prev2[0]; moved, it would read [1]
        else:
            nisa.memset(dst=old, value=0.0)
        ws = [nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf) for _ in range(N_W)]
        for i, t in enumerate(ws):
            nisa.dma_copy(dst=t, src=w[i])
        acc = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for t in ws:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        if mode == "loop":
            nl.fori_loop(
                0, 2, lambda i: nisa.tensor_tensor(dst=acc, data1=acc, data2=ws[0], op=nl.add)
            )
        for t in ws:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=old, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    return kernel


@pytest.mark.parametrize("mode", ["register", "loop"])
def test_no_move_past_a_register_write_or_a_device_loop(mode):
    w, _ = _inputs()
    prev2 = np.random.default_rng(2).standard_normal((2, P, COLS)).astype(np.float32)
    extra = 2 * w[0] if mode == "loop" else prev2[0]
    want = 2 * w.sum(axis=0) + extra
    # with room for all five tiles it runs, reading prev2[0] (the register's value then)
    res = run(_sequencer_kernel(mode), w, prev2, target=_small_sbuf(FOUR_TILES + COLS * 4))
    np.testing.assert_allclose(res.outputs, want, rtol=1e-5, atol=1e-5)
    # with four, the load / fill cannot count from the read: an overflow
    with pytest.raises(MemoryPlanError) as e:
        run(_sequencer_kernel(mode), w, prev2, target=_small_sbuf(FOUR_TILES))
    assert e.value.rule == "SBUF_OVERFLOW"
    assert "needs 2048 B per partition but 8192 of 8192 usable B per partition are live" in str(
        e.value
    )


def _gather_kernel(mode: str):
    """`old` gathered from HBM rows through an SBUF index tile (`vector_offset`), read
    at the end: "move" -- nothing pins the gather; "rewrite" -- the index tile is
    rewritten before `old` is read; "depends_on" -- an add between the passes names the
    gather in a `depends_on` edge."""

    def kernel(w, prev, rows):
        out = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.shared_hbm)
        idx = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=rows)
        old = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
        src = prev.ap([[COLS, P], [1, COLS]], vector_offset=idx, indirect_dim=0)
        gather = nisa.dma_copy(dst=old, src=src)
        if mode == "rewrite":
            nisa.memset(dst=idx, value=0)
        ws = [nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf) for _ in range(N_W)]
        for i, t in enumerate(ws):
            nisa.dma_copy(dst=t, src=w[i])
        acc = nl.ndarray((P, COLS), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for t in ws:
            add = nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        if mode == "depends_on":
            add.depends_on(gather)
        for t in ws:
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=old, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    return kernel


IDX_GRANULE = 64  # the (P, 1) int32 index tile at 64-byte alignment


@pytest.mark.parametrize("mode", ["move", "rewrite", "depends_on"])
def test_a_gather_moves_with_its_index_tile_unless_pinned(mode):
    rng = np.random.default_rng(4)
    w, prev = _inputs()
    rows = rng.permutation(P).astype(np.int32).reshape(P, 1)
    want = 2 * w.sum(axis=0) + prev[rows[:, 0]]
    kernel = _gather_kernel(mode)
    # four 2 KiB tiles and the index: the gather must count from `old`'s read
    room = _small_sbuf(FOUR_TILES + IDX_GRANULE)
    if mode == "move":
        res = run(kernel, w, prev, rows, target=room)
        np.testing.assert_allclose(res.outputs, want, rtol=1e-5, atol=1e-5)
        assert res.peak_sbuf_bytes == FOUR_TILES + IDX_GRANULE
        # the index tile lives until the moved gather's new slot: without its bytes the
        # same plan overflows
        with pytest.raises(MemoryPlanError):
            run(kernel, w, prev, rows, target=_small_sbuf(FOUR_TILES))
    else:
        with pytest.raises(MemoryPlanError) as e:
            run(kernel, w, prev, rows, target=room)
        assert e.value.rule == "SBUF_OVERFLOW"
        assert "fills and loads deferred to their first reader" in str(e.value)
