"""aws_ranks: an AWS collective case (collective_ranks > 1, per-rank input and golden
generators) runs one launch per rank and checks every rank's own golden values."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from nki_kernels.conformance import aws_ranks
from nki_kernels.conformance.aws_tests import InterpreterOrchestrator
from nki_kernels.interp import nisa, nki, nl

ncc = nki.collectives


@nki.jit
def gather_rows(x, g, n):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray((x.shape[0] * n, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_gather(srcs=[src], dsts=[dst], replica_group=g, collective_dim=0)
    out = nl.ndarray(dst.shape, dtype=dst.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


class PerRank:  # the shape of AWS's PerRankLazy*Generator: for_rank(rank_id)
    def __init__(self, fn):
        self.fn = fn

    def for_rank(self, rank_id):
        return self.fn(rank_id)


def _case(golden_of, ranks=2, lnc=1):
    xs = np.arange(ranks * 3 * 4, dtype=np.float32).reshape(ranks, 3, 4)
    g = ncc.ReplicaGroup([list(range(ranks))])
    return SimpleNamespace(
        kernel_func=gather_rows,
        compiler_input=SimpleNamespace(logical_nc_config=lnc, platform_target=None),
        kernel_input=PerRank(lambda r: {"x": xs[r], "g": g, "n": ranks}),
        inference_args=SimpleNamespace(collective_ranks=ranks),
        validation_args=SimpleNamespace(
            golden_output=PerRank(lambda r: {"out": golden_of(xs, r)}),
            relative_accuracy=0.0,
            absolute_accuracy=0.0,
        ),
    )


@pytest.mark.parametrize("lnc", [1, 2])
def test_every_rank_is_checked_against_its_golden(lnc):
    case = _case(lambda xs, r: xs.reshape(-1, 4), lnc=lnc)
    assert aws_ranks.collective_ranks(case) == 2
    InterpreterOrchestrator().execute(case)  # the hook in aws_tests hands it to aws_ranks


def test_a_wrong_rank_is_named():
    def golden(xs, r):
        want = xs.reshape(-1, 4).copy()
        if r == 1:
            want[0, 0] += 1.0
        return want

    with pytest.raises(AssertionError, match=r"output 'out'.*\(rank 1 of 2\)"):
        aws_ranks.execute_ranks(_case(golden))


@nki.jit
def own_and_gathered(x, g, n):
    own = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=own, src=x)
    return own, gather_rows(x, g, n)


def test_a_lazy_golden_checking_some_outputs_is_matched_by_name_on_every_rank():
    """As for one launch (aws_tests): a LazyGoldenGenerator's placeholders name the
    outputs in return order, and its golden may check only some of them."""
    case = _case(lambda xs, r: None)
    xs = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    case.kernel_func = own_and_gathered
    placeholders = {"own": np.zeros((3, 4)), "out": np.zeros((6, 4))}
    golden = {"out": xs.reshape(-1, 4)}  # the second output only
    case.validation_args.golden_output = SimpleNamespace(output_ndarray=placeholders, golden=golden)
    InterpreterOrchestrator().execute(case)
    golden["out"] = golden["out"] + 1.0
    with pytest.raises(AssertionError, match=r"output 'out'.*\(rank 0 of 2\)"):
        InterpreterOrchestrator().execute(case)
