"""Ops on the device path with TorchNeuron present (the test doubles of
`nki_kernels.testing.torch_neuronx_standin`): defined through `nki_op`, eager and under
`torch.compile` at LNC 1 and 2, the body traced on FakeTensors with each kernel call one
graph node, and one launcher per specialization.

The library's ops were defined at import, without TorchNeuron, so each test defines a
clone of a library op from the same pieces (`define_op` with the op's impl, fake,
autograd, validation) inside `real_device()`, where `nki_op` is available.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from nki_kernels.norm.reference import rms_norm_bwd_ref, rms_norm_ref
from nki_kernels.ops.registry import NkiOp, define_op, registered_ops
from nki_kernels.runtime import KERNEL_CACHE
from nki_kernels.runtime import lnc as runtime_lnc
from nki_kernels.testing import torch_neuronx_standin as standin
from nki_kernels.testing.tolerances import assert_close, tolerance

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
_names = itertools.count()


def clone(name: str) -> NkiOp:
    """The library op `name` defined again, now (under real_device) through nki_op."""
    e = registered_ops()[name]
    return define_op(
        f"standin_{name}_{next(_names)}", e.impl, fake=e.fake, backward=e.backward,
        setup_context=e.setup_context, validate=e.validate, mutates_args=e.mutates_args,
        examples=e.examples, traceable=e.traceable,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    standin.STATE.reset()
    yield
    runtime_lnc.set_runtime_lnc(None)


def test_without_torchneuron_the_ops_are_plain_custom_ops() -> None:
    ops = registered_ops()
    assert not any(op.via_nki_op for op in ops.values())
    assert ops["rms_norm"].traceable and ops["moe_route"].traceable
    # bodies that plan on host data stay plain custom ops even with TorchNeuron
    assert not ops["moe_mlp"].traceable and not ops["flash_attention"].traceable


def _inputs(neuron: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 100, 256, generator=g).to(torch.bfloat16)  # 300 rows: ragged tail
    w = (1 + 0.1 * torch.randn(256, generator=g)).to(torch.bfloat16)
    dy = torch.randn(3, 100, 256, generator=g).to(torch.bfloat16)
    return x, w, dy


def _check_rms(out: torch.Tensor, dx: torch.Tensor, dw: torch.Tensor, x: Any, w: Any, dy: Any):
    y_ref, _ = rms_norm_ref(x, w, 1e-6)
    dx_ref, dw_ref = rms_norm_bwd_ref(dy, x, w, 1e-6)
    assert out.device.type == dx.device.type == "neuron"
    assert_close(out, y_ref, tol=tolerance(torch.bfloat16, 256, 4.0))
    assert_close(dx, dx_ref, tol=tolerance(torch.bfloat16, 256, 4.0))
    assert_close(dw, dw_ref, tol=tolerance(torch.bfloat16, 300, 30.0))


@pytest.mark.parametrize("lnc", [1, 2])
def test_eager_through_nki_op_at_the_runtime_lnc(neuron: str, lnc: int) -> None:
    x, w, dy = _inputs(neuron)
    with standin.real_device(lnc=lnc):
        op = clone("rms_norm")
        assert op.via_nki_op
        KERNEL_CACHE.clear()
        for _ in range(2):
            xn = x.to(neuron).requires_grad_()
            wn = w.to(neuron).requires_grad_()
            out = op(xn, wn, 1e-6)
            out.backward(dy.to(neuron))
        # each kernel specialized and wrapped once, at the runtime's LNC, reused after
        keys = KERNEL_CACHE.keys()
        assert {k.lnc for k in keys} == {lnc} and {k.backend for k in keys} == {"neuron"}
        assert KERNEL_CACHE.wraps == KERNEL_CACHE.compiles == len(keys) >= 2
        assert KERNEL_CACHE.hits >= len(keys)
    assert set(standin.STATE.calls_by_lnc) == {lnc}
    assert standin.STATE.reuses >= len(keys) and standin.STATE.traced_calls == 0
    _check_rms(out, xn.grad, wn.grad, x, w, dy)


@pytest.mark.parametrize("lnc", [1, 2])
def test_compile_traces_into_the_body_each_kernel_one_node(neuron: str, lnc: int) -> None:
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    x, w, dy = _inputs(neuron)
    with standin.real_device(lnc=lnc):
        op = clone("rms_norm")
        torch._dynamo.reset()
        fn = torch.compile(
            lambda a, b: op(a, b, 1e-6) * 2,
            backend=aot_autograd(fw_compiler=record, bw_compiler=record),
            fullgraph=True,
        )
        xn = x.to(neuron).requires_grad_()
        wn = w.to(neuron).requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            out = fn(xn, wn)
            out.backward((dy / 2).to(neuron))  # d out / d y = 2: the grad of y is dy
    forward = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    # the op's body was traced: its kernel call is a node, the op itself is not
    assert any("nki_standin.kernel_call" in t for t in forward), forward
    assert not any(op.name in t for t in forward), forward
    assert standin.STATE.traced_calls >= 1 and set(standin.STATE.calls_by_lnc) <= {lnc}
    _check_rms(out / 2, xn.grad, wn.grad, x, w, dy)


def _to(x: Any, device: str) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    return x


def _leaves(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _leaves(v)]
    return []


LIBRARY_OPS = sorted(
    n for n, op in registered_ops().items() if op.impl.__module__.startswith("nki_kernels.ops.")
)


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("name", LIBRARY_OPS)
def test_every_library_op_on_the_device_path(neuron: str, name: str, lnc: int) -> None:
    """Each op's own examples on 'real' neuron tensors (the doubles) at the runtime's LNC
    match the same op on CPU (the interpreter at LNC 1): every kernel an op launches goes
    through `kernel[lnc]` once per specialization."""
    op = registered_ops()[name]
    assert op.examples is not None
    for args, kwargs in op.examples():
        want = op(*_to(args, "cpu"), **kwargs)
        with standin.real_device(lnc=lnc):
            KERNEL_CACHE.clear()
            standin.STATE.reset()
            got = op(*_to(args, neuron), **_to(kwargs, neuron))
            assert KERNEL_CACHE.wraps == KERNEL_CACHE.compiles >= 1
            assert {k.lnc for k in KERNEL_CACHE.keys()} == {lnc}
        assert set(standin.STATE.calls_by_lnc) == {lnc}
        for g, w in zip(_leaves(got), _leaves(want)):
            assert g.device.type == "neuron" and g.dtype == w.dtype and g.shape == w.shape
            if w.dtype.is_floating_point:
                n = max(w.shape) if w.dim() else 1
                scale = float(w.abs().max()) if w.numel() else 1.0
                assert_close(g, w, tol=tolerance(w.dtype, n, scale or 1.0), msg=name)
            else:
                assert torch.equal(g.cpu(), w), name
