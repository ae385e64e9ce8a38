"""The MoE package's `@nki.jit` entry points are thin: each calls an undecorated kernel
body (traced inline, as NKI inlines helpers), and no kernel of the package calls another
`@nki.jit` kernel (NKI 0.6 documents the decorator on the top-level kernel only; checked
over the whole package by tests/test_no_nested_kernels.py). The fused and split entry
points take the body's arguments, so a new config field added to a body without its
entry point fails here rather than at a launch."""

from __future__ import annotations

import inspect

import pytest

from nki_kernels.moe.blockwise_mlp import moe_mlp_fwd, moe_mlp_fwd_body
from nki_kernels.moe.blockwise_mlp_bwd import moe_mlp_bwd, moe_mlp_bwd_body
from nki_kernels.moe.split_kernels import moe_mlp_bwd_split, moe_mlp_fwd_split

FUSED = [(moe_mlp_fwd, moe_mlp_fwd_body), (moe_mlp_bwd, moe_mlp_bwd_body)]
SPLIT = [(moe_mlp_fwd_split, moe_mlp_fwd_body), (moe_mlp_bwd_split, moe_mlp_bwd_body)]
Kernel = type(moe_mlp_fwd)  # what `@nki.jit` makes on this backend


def _params(fn: object) -> dict[str, object]:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()}  # type: ignore[arg-type]


@pytest.mark.parametrize(("kernel", "body"), FUSED, ids=lambda x: getattr(x, "__name__", ""))
def test_a_fused_entry_point_takes_its_bodys_arguments(kernel: Kernel, body: object) -> None:
    assert inspect.signature(kernel.fn) == inspect.signature(body)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kernel", "body"), SPLIT, ids=lambda x: getattr(x, "__name__", ""))
def test_a_split_entry_point_takes_its_bodys_arguments(kernel: Kernel, body: object) -> None:
    # the same arguments and defaults; the gate's weight (and gradient) named as the gate's,
    # the up's moved next to it and required
    rename = {"w_gate": "w_gate_up", "dw_gate": "dw_gate_up"}
    got = {rename.get(n, n): d for n, d in _params(kernel.fn).items()}
    want = _params(body)
    moved = {"w_up", "dw_up"} & set(got)
    assert set(got) == set(want)
    assert all(got[n] is inspect.Parameter.empty for n in moved)
    assert {n: d for n, d in got.items() if n not in moved} == {
        n: d for n, d in want.items() if n not in moved
    }
