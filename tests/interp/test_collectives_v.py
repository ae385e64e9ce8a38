"""The variable-length and point-to-point collectives against NumPy references, and
their documented restrictions (rule COLLECTIVE)."""

from __future__ import annotations

import numpy as np
import pytest
from test_collectives import _out, _staged  # same staging helpers (tests/interp on sys.path)

from nki_kernels.interp.errors import NkiValidationError
from nki_kernels.interp.package import nki
from nki_kernels.interp.ranks import run_ranks

nl, nisa, ncc = nki.language, nki.isa, nki.collectives
RG = ncc.ReplicaGroup


@nki.jit
def agv_kernel(x, meta, g, n_dst, known, rdispls):
    src, dst = _staged(x), _staged(x, (1, n_dst))
    zero = nl.ndarray((1, n_dst), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    nisa.dma_copy(dst=dst, src=zero)
    ncc.all_gather_v(
        srcs=[src],
        dsts=[dst],
        replica_group=g,
        metadata_tensor=meta,
        recv_counts_known=known,
        has_rdispls=rdispls,
    )
    return _out(dst)


def _agv_inputs(known=False, rdispls=False, rows=3):
    rng = np.random.default_rng(5)
    counts, displs = [3, 1, 4, 2], [0, 2, 1, 3]
    xs = rng.standard_normal((4, 1, 7)).astype(np.float32)
    metas = []
    for r in range(4):
        m = np.zeros((rows, 4), np.uint32)
        m[0, 0], m[1, 0] = counts[r], displs[r]
        metas.append(m)
    g = RG([[0, 1, 2, 3]])
    kw = [
        {"x": xs[r], "meta": metas[r], "g": g, "n_dst": 16, "known": known, "rdispls": rdispls}
        for r in range(4)
    ]
    return xs, metas, counts, displs, kw


def test_all_gather_v_places_each_ranks_chunk_in_its_slot():
    xs, metas, counts, displs, kw = _agv_inputs()
    res = run_ranks(agv_kernel, kw, lnc=2)
    want = np.zeros(16, np.float32)
    for j in range(4):
        want[4 * j : 4 * j + counts[j]] = xs[j, 0, displs[j] : displs[j] + counts[j]]
    for r, out in enumerate(res):
        np.testing.assert_array_equal(out.outputs.reshape(-1), want)
        np.testing.assert_array_equal(metas[r][2], counts)  # row 2: the receive counts


def test_all_gather_v_leaves_row_2_when_the_counts_are_known():
    _, metas, _, _, kw = _agv_inputs(known=True)
    run_ranks(agv_kernel, kw, lnc=2)
    assert all(not m[2].any() for m in metas)


@nki.jit
def a2av_kernel(x, meta, g, rdispls):
    src, dst = _staged(x), _staged(x, x.shape)
    zero = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    nisa.dma_copy(dst=dst, src=zero)
    ncc.all_to_all_v(
        srcs=[src], dsts=[dst], replica_group=g, metadata_tensor=meta, has_rdispls=rdispls
    )
    return _out(dst)


@pytest.mark.parametrize("rdispls", [False, True])
def test_all_to_all_v_on_trn3_matches_numpy(rdispls):
    n, slot = 8, 3
    rng = np.random.default_rng(6)
    xs = rng.standard_normal((n, 1, n * slot)).astype(np.float32)
    counts = rng.integers(0, slot + 1, size=(n, n))  # counts[j, k]: j sends to k
    metas = []
    for j in range(n):
        m = np.zeros((4, n), np.uint32)
        m[0] = counts[j]
        m[1] = np.arange(n) * slot  # chunk for k starts at k * slot of j's src
        m[3] = (np.arange(n)[::-1] * slot) if rdispls else 0  # receive slots reversed
        metas.append(m)
    g = RG([list(range(n))])
    kw = [{"x": xs[r], "meta": metas[r], "g": g, "rdispls": rdispls} for r in range(n)]
    res = run_ranks(a2av_kernel, kw, lnc=2, target="trn3")
    for k, out in enumerate(res):
        want = np.zeros(n * slot, np.float32)
        for j in range(n):
            at = (n - 1 - j) * slot if rdispls else j * slot
            c = counts[j, k]
            want[at : at + c] = xs[j, 0, k * slot : k * slot + c]
        np.testing.assert_array_equal(out.outputs.reshape(-1), want)
        np.testing.assert_array_equal(metas[k][2], counts[:, k])


@nki.jit
def permute_kernel(x, pairs):
    src, dst = _staged(x), _staged(x, x.shape)
    ncc.collective_permute(srcs=[src], dsts=[dst], source_target_pairs=pairs)
    return _out(dst)


def test_collective_permute_swaps_pairs():
    xs = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    res = run_ranks(permute_kernel, [{"x": x, "pairs": ((0, 1), (1, 0))} for x in xs])
    np.testing.assert_array_equal(res[0].outputs, xs[1])
    np.testing.assert_array_equal(res[1].outputs, xs[0])


@nki.jit
def ring_kernel(x, y, g, op, steps):
    a, b, d = _staged(x), _staged(y), _staged(x, x.shape)
    ids = nl.ndarray((1, steps), dtype=nl.int32, buffer=nl.shared_hbm)
    if op is None:
        ncc.collective_permute_implicit(
            srcs_by_channel=[[a]], dsts_by_channel=[[d]], replica_group=g
        )
    else:
        ncc.collective_permute_implicit_reduce(
            srcs0_by_channel=[[a]],
            srcs1_by_channel=[[b]],
            dsts_by_channel=[[d]],
            replica_group=g,
            op=op,
        )
    for i in range(steps):
        reg = ncc.collective_permute_implicit_current_processing_rank_id(i, g)
        nisa.register_store(ids[0:1, i : i + 1], reg)
    return _out(d), ids


@pytest.mark.parametrize("op", [None, nl.maximum])
def test_implicit_ring_sends_to_the_successor(op):
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((3, 4, 6)).astype(np.float32)
    ys = rng.standard_normal((3, 4, 6)).astype(np.float32)
    g = RG([[2, 0, 1]])  # ring 2 -> 0 -> 1 -> 2
    kw = [{"x": xs[r], "y": ys[r], "g": g, "op": op, "steps": 3} for r in range(3)]
    res = run_ranks(ring_kernel, kw)
    pred = {0: 2, 1: 0, 2: 1}
    for r, out in enumerate(res):
        got, ids = out.outputs
        p = pred[r]
        want = xs[p] if op is None else np.maximum(xs[p], ys[p])
        np.testing.assert_array_equal(got, want)
        ring = [2, 0, 1]
        pos = ring.index(r)
        np.testing.assert_array_equal(ids[0], [ring[(pos - i) % 3] for i in range(3)])


# ---- rules ---------------------------------------------------------------------------------
def _expect(match, kernel, kw, **launch):
    with pytest.raises(NkiValidationError) as e:
        run_ranks(kernel, kw, **launch)
    assert e.value.rule == "COLLECTIVE", str(e.value)
    assert match in str(e.value)


def test_all_gather_v_restrictions():
    _, _, _, _, kw = _agv_inputs()
    _expect("only LNC=2", agv_kernel, kw, lnc=1)
    _, _, _, _, kw = _agv_inputs(rdispls=True, rows=4)
    _expect("has_rdispls=True is not supported", agv_kernel, kw, lnc=2)
    _, _, _, _, kw = _agv_inputs()
    for k in kw:
        k["g"] = RG([[0, 1], [2, 3]])
    _expect("exactly 4 ranks", agv_kernel, kw, lnc=2)
    _, _, _, _, kw = _agv_inputs()
    for k in kw:
        k["meta"] = np.zeros((2, 4), np.uint32)
    _expect("metadata_tensor on HBM", agv_kernel, kw, lnc=2)


def test_all_to_all_v_restrictions():
    x, m = np.zeros((1, 8), np.float32), np.zeros((3, 8), np.uint32)
    kw = [{"x": x, "meta": m.copy(), "g": RG([list(range(8))]), "rdispls": False}] * 8
    _expect("only inter-node replica groups", a2av_kernel, [dict(k) for k in kw], lnc=2)
    _expect("need LNC=2", a2av_kernel, [dict(k) for k in kw], lnc=1, target="trn3")
    kw4 = [
        {"x": x, "meta": np.zeros((3, 4), np.uint32), "g": RG([[0, 1, 2, 3]]), "rdispls": False}
    ] * 4
    _expect("more than one device", a2av_kernel, [dict(k) for k in kw4], lnc=2, target="trn3")


def test_permute_and_ring_restrictions():
    x = np.zeros((2, 2), np.float32)
    _expect("target of two pairs", permute_kernel, [{"x": x, "pairs": ((0, 1), (1, 1))}] * 2)
    _expect(
        "in none of the source_target_pairs",
        permute_kernel,
        [{"x": x, "pairs": ((0, 1), (1, 0))}] * 3,
    )
    kw = [{"x": x, "y": x, "g": RG([[0, 1]]), "op": None, "steps": 1}] * 2
    _expect("exactly one tensor", bad_channel_kernel, [dict(k) for k in kw])
    _expect("consecutive from 0", bad_ids_kernel, [dict(k) for k in kw])


@nki.jit
def bad_channel_kernel(x, y, g, op, steps):
    a, b, d = _staged(x), _staged(y), _staged(x, x.shape)
    ncc.collective_permute_implicit(
        srcs_by_channel=[[a, b]], dsts_by_channel=[[d, d]], replica_group=g
    )
    return _out(d)


@nki.jit
def bad_ids_kernel(x, y, g, op, steps):
    a, d = _staged(x), _staged(x, x.shape)
    ncc.collective_permute_implicit(
        srcs_by_channel=[[a]], dsts_by_channel=[[d]], replica_group=g, channel_ids=[1]
    )
    return _out(d)
