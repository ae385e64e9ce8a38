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
        f"testonly_standin_{name}_{next(_names)}", e.impl, fake=e.fake, backward=e.backward,
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
    # every op's body traces; the parts that plan on tensor data are nki_host nodes
    assert all(op.traceable for op in ops.values() if op.impl.__module__.startswith("nki_kernels."))


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
                n = max(*w.shape, 1) if w.dim() else 1  # an empty output: 1
                scale = float(w.abs().max()) if w.numel() else 1.0
                assert_close(g, w, tol=tolerance(w.dtype, n, scale or 1.0), msg=name)
            else:
                assert torch.equal(g.cpu(), w), name


def _graph_targets(gm: torch.fx.GraphModule) -> list[str]:
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        out.append(str(n.target))
        if "auto_functionalized" in str(n.target) and n.args:  # an op that writes in
            out.append(str(n.args[0]))  # place (a KV cache), functionalized: the op too
    return out


# ops whose plan reads tensor data: that part is one nki_host node under tracing
HOST_NODES = {
    "moe_mlp_backward": "nki_host.moe_block_plan",
    "decode_attention": "nki_host.decode_attention",
    "serving_attention": "nki_host.serving_attention",
    "kv_cache_write": "nki_host.kv_cache_write",
}
# ops whose whole call plans on tensor data (cache lengths, slots): no kernel node
WHOLE_CALL_ON_HOST = {"decode_attention", "serving_attention", "kv_cache_write"}


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("name", LIBRARY_OPS)
def test_every_library_op_compiles_through_nki_op(neuron: str, name: str, lnc: int) -> None:
    """Each op, defined through the `nki_op` double, under torch.compile at the runtime's
    LNC: the body is traced (each kernel call one graph node, never the op itself), the
    compiled call matches the op on CPU, and each kernel is wrapped once per
    specialization."""
    op = registered_ops()[name]
    assert op.examples is not None and op.traceable, name
    for args, kwargs in op.examples():
        want = op(*_to(args, "cpu"), **kwargs)
        graphs: list[torch.fx.GraphModule] = []
        record = aot_autograd(fw_compiler=lambda gm, _i, g=graphs: g.append(gm) or gm.forward)
        with standin.real_device(lnc=lnc):
            twin = clone(name)
            assert twin.via_nki_op
            torch._dynamo.reset()
            KERNEL_CACHE.clear()
            fn = torch.compile(lambda *a, twin=twin, kw=kwargs: twin(*a, **kw),
                               backend=record, fullgraph=True)  # fmt: skip
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                got = fn(*_to(args, neuron))
            assert KERNEL_CACHE.wraps == KERNEL_CACHE.compiles >= 1
            assert {k.lnc for k in KERNEL_CACHE.keys()} == {lnc}
        forward = _graph_targets(graphs[0])
        kernel_nodes = name not in WHOLE_CALL_ON_HOST
        assert kernel_nodes == any("nki_standin.kernel_call" in t for t in forward), forward
        assert not any(twin.name in t for t in forward), (name, forward)
        if name in HOST_NODES:
            hosts = HOST_NODES[name]
            hosts = (hosts,) if isinstance(hosts, str) else hosts
            assert any(h in t for h in hosts for t in forward), (name, forward)
        assert (standin.STATE.traced_calls >= 1) == kernel_nodes
        assert set(standin.STATE.calls_by_lnc) <= {lnc}
        for g, w in zip(_leaves(got), _leaves(want), strict=True):
            assert g.device.type == "neuron" and g.dtype == w.dtype and g.shape == w.shape
            if w.dtype.is_floating_point:
                n = max(*w.shape, 1) if w.dim() else 1  # an empty output: 1
                scale = float(w.abs().max()) if w.numel() else 1.0
                assert_close(g, w, tol=tolerance(w.dtype, n, scale or 1.0), msg=name)
            else:
                assert torch.equal(g.cpu(), w), name


@pytest.mark.parametrize("lnc", [1, 2])
def test_attention_masks_read_on_the_host_are_one_host_node(neuron: str, lnc: int) -> None:
    """kv_lens / segment_ids / attn_mask values plan the tiles: under compile the call is
    one `nki_host::flash_attention` node (forward and backward), and matches CPU."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 130, 64, generator=g) for _ in range(3))
    lens = torch.tensor([130, 57])
    mask = torch.rand(130, 130, generator=g) > 0.3
    dy = torch.randn(2, 2, 130, 64, generator=g)

    def loss(op: Any, a: Any, b: Any, c: Any, kl: Any, am: Any, grad: Any) -> Any:
        out, _ = op(a, b, c, kl, None, am, causal=False)
        return (out * grad).sum()

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    loss(registered_ops()["flash_attention"], *leaves, lens, mask, dy).backward()
    want = [t.grad for t in leaves]
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    with standin.real_device(lnc=lnc):
        twin = clone("flash_attention")
        torch._dynamo.reset()
        both = aot_autograd(fw_compiler=record, bw_compiler=record)
        fn = torch.compile(lambda *a: loss(twin, *a), fullgraph=True, backend=both)
        dev = [t.to(neuron).requires_grad_() for t in (q, k, v)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            fn(*dev, lens.to(neuron), mask.to(neuron), dy.to(neuron)).backward()
        # the backward op (the library's was defined before TorchNeuron "existed"): its
        # clone through nki_op, with the masks, is one host node too
        bwd_twin = clone("flash_attention_backward")
        out, lse = registered_ops()["flash_attention"](q, k, v, lens, None, mask)
        args = (dy, None, q, k, v, out, lse, lens, None, mask)
        bgraphs: list[torch.fx.GraphModule] = []
        torch._dynamo.reset()
        brecord = aot_autograd(fw_compiler=lambda gm, _i: bgraphs.append(gm) or gm.forward)
        bfn = torch.compile(lambda *a: bwd_twin(*a, causal=False), fullgraph=True,
                            backend=brecord)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            grads = bfn(*_to(args, neuron))
    fwd = _graph_targets(graphs[0])
    assert any("nki_host.flash_attention" in t for t in fwd), fwd
    assert any("nki_host.flash_attention_backward" in t for t in _graph_targets(bgraphs[0]))
    for got, exp in zip([*[t.grad for t in dev], *grads], [*want, *want], strict=True):
        assert_close(got, exp, tol=tolerance(torch.float32, 130, float(exp.abs().max())))
