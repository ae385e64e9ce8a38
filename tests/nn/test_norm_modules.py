"""nki_kernels.nn.RMSNorm / LayerNorm: drop-in for torch.nn.RMSNorm / torch.nn.LayerNorm
(same state_dict, same results within the derived bound), on CPU and on the emulated
neuron device (`module.to("neuron")`, forward, backward, .grad on the device)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from norm_helpers import (
    assert_within,
    check_all,
    ln_bwd_bounds,
    ln_fwd_bound,
    rms_bwd_bounds,
    rms_fwd_bound,
)
from torch import nn

from nki_kernels.nn import LayerNorm, RMSNorm
from nki_kernels.nn.norm import default_rms_eps

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

# Tolerance table: (u, tiny) per dtype -- unit roundoff and smallest subnormal. Drop-in
# equivalence is checked as: our module AND the torch module are both within the derived
# bound (norm_helpers) of the same fp32 reference.
TOL = {
    torch.float32: (2.0**-24, 2.0**-149),
    torch.bfloat16: (2.0**-8, 2.0**-133),
    torch.float16: (2.0**-11, 2.0**-24),
}


def _forward_within(m: nn.Module, x: torch.Tensor, y: torch.Tensor, what: str) -> None:
    """y (from m, ours or torch's) is within the derived bound of the fp32 reference."""
    k = len(m.normalized_shape)
    h = math.prod(m.normalized_shape)
    x2 = x.detach().cpu().reshape(-1, h)
    w = m.weight.detach().cpu().reshape(-1) if m.weight is not None else None
    tol = TOL[x.dtype]
    if isinstance(m, (LayerNorm, nn.LayerNorm)):
        b = m.bias.detach().cpu().reshape(-1) if m.bias is not None else None
        yr, bound = ln_fwd_bound(x2, w, b, *tol, eps=m.eps)
    else:
        eps = m.eps if m.eps is not None else default_rms_eps(x.dtype)
        yr, bound = rms_fwd_bound(x2, w, *tol, eps=eps)
    assert y.shape[-k:] == x.shape[-k:]
    assert_within(what, y.detach().cpu().reshape(-1, h), yr, bound)


def _seed(m: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() else 0.0))
    return m


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (lambda: RMSNorm(64), lambda: nn.RMSNorm(64)),
        (lambda: RMSNorm((4, 16), eps=1e-6), lambda: nn.RMSNorm((4, 16), eps=1e-6)),
        (
            lambda: RMSNorm(64, elementwise_affine=False),
            lambda: nn.RMSNorm(64, elementwise_affine=False),
        ),
        (lambda: LayerNorm(64), lambda: nn.LayerNorm(64)),
        (lambda: LayerNorm(64, bias=False), lambda: nn.LayerNorm(64, bias=False)),
        (
            lambda: LayerNorm((4, 16), elementwise_affine=False),
            lambda: nn.LayerNorm((4, 16), elementwise_affine=False),
        ),
    ],
)
def test_state_dict_round_trip_and_same_output(ours, theirs) -> None:  # type: ignore[no-untyped-def]
    a, b = ours(), _seed(theirs())
    assert list(a.state_dict()) == list(b.state_dict())
    a.load_state_dict(b.state_dict(), strict=True)
    c = theirs()
    c.load_state_dict(a.state_dict(), strict=True)
    for k, v in b.state_dict().items():
        assert torch.equal(c.state_dict()[k], v)
    x = torch.randn(3, 37, 64, generator=torch.Generator().manual_seed(1)).reshape(3, 37, 4, 16)
    if a.normalized_shape == (64,):
        x = x.reshape(3, 37, 64)
    _forward_within(a, x, a(x), f"ours {type(a).__name__}")
    _forward_within(b, x, b(x), f"torch {type(b).__name__}")


def test_rms_norm_default_eps_follows_the_input_dtype() -> None:
    m = RMSNorm(96).to(torch.bfloat16)
    x = torch.randn(130, 96, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = m(x)
    assert y.dtype == torch.bfloat16
    _forward_within(m, x, y, "default eps of bf16 input")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rms_norm_default_eps_is_torchs_for_small_inputs(dtype: torch.dtype) -> None:
    """eps=None: torch's RMSNorm takes fp32's epsilon for bf16 / fp16 inputs (its compute
    type's); on inputs of rms ~1e-3 the input dtype's own epsilon would shrink y ~100x."""
    assert default_rms_eps(dtype) == torch.finfo(torch.float32).eps
    ours, theirs = RMSNorm(64).to(dtype), nn.RMSNorm(64).to(dtype)
    x = (1e-3 * torch.randn(40, 64, generator=torch.Generator().manual_seed(4))).to(dtype)
    want = theirs(x)
    _forward_within(ours, x, ours(x), f"ours, eps=None, {dtype}")
    _forward_within(theirs, x, want, f"torch, eps=None, {dtype}")
    got = nn.functional.rms_norm(x, (64,), None, default_rms_eps(dtype))
    torch.testing.assert_close(got, want, atol=0.0, rtol=0.0)


def test_fp32_parameters_with_bf16_input() -> None:
    m = _seed(LayerNorm(128))
    x = torch.randn(4, 33, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x.requires_grad_(True)
    y = m(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m.weight.grad is not None and m.weight.grad.dtype == torch.float32
    assert m.bias.grad is not None and x.grad is not None and x.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("cls,ref_cls", [(RMSNorm, nn.RMSNorm), (LayerNorm, nn.LayerNorm)])
def test_module_on_neuron_device(cls, ref_cls, neuron: str) -> None:  # type: ignore[no-untyped-def]
    kw = {"eps": 1e-6} if cls is RMSNorm else {}  # the eps of the norm_helpers references
    ref = _seed(ref_cls(80, **kw))
    m = cls(80, **kw)
    m.load_state_dict(ref.state_dict())
    m = m.to(neuron)
    assert all(p.device.type == "neuron" and isinstance(p, nn.Parameter) for p in m.parameters())
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 70, 80, generator=g)
    dy = torch.randn(2, 70, 80, generator=g)
    xn = x.to(neuron).requires_grad_(True)
    y = m(xn)
    assert y.device.type == "neuron"
    y.backward(dy.to(neuron))
    xr = x.clone().requires_grad_(True)
    yr = ref(xr)
    yr.backward(dy)
    _forward_within(m, x, y, "y on neuron")
    assert xn.grad is not None and xn.grad.device.type == "neuron"
    assert all(p.grad is not None and p.grad.device.type == "neuron" for p in m.parameters())
    x2, dy2 = x.reshape(-1, 80), dy.reshape(-1, 80)
    if cls is LayerNorm:
        want = ln_bwd_bounds(dy2, x2, ref.weight.detach(), ref.bias.detach(), *TOL[torch.float32])
        got = {"dx": xn.grad.reshape(-1, 80), "dw": m.weight.grad, "db": m.bias.grad}
    else:
        want = rms_bwd_bounds(dy2, x2, ref.weight.detach(), *TOL[torch.float32])
        got = {"dx": xn.grad.reshape(-1, 80), "dw": m.weight.grad}
    check_all(got, want, f"{cls.__name__} on neuron")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    opt.step()
    assert all(p.device.type == "neuron" for p in m.parameters())


@pytest.mark.parametrize(
    "ours,theirs",
    [(lambda: RMSNorm(8), lambda: nn.RMSNorm(8)), (lambda: LayerNorm(8), lambda: nn.LayerNorm(8))],
    ids=["rms", "layer"],
)
def test_empty_and_integer_inputs_behave_as_torch_modules(ours, theirs) -> None:  # type: ignore[no-untyped-def]
    """An input without rows gives an empty output (and zero parameter gradients), as
    torch's modules do (it used to raise the op's non-empty error); an integer input
    names `input` (it failed in torch.finfo)."""
    m, ref = ours(), theirs()
    x = torch.randn(2, 0, 8, requires_grad=True)
    y = m(x)
    assert y.shape == ref(x).shape == (2, 0, 8) and y.dtype == x.dtype
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert m.weight.grad is not None and not m.weight.grad.any()
    with pytest.raises(TypeError, match=r"input: expected dtype float32, bfloat16, float16; got"):
        m(torch.ones(2, 8, dtype=torch.int64))


@pytest.mark.parametrize("cls", [RMSNorm, LayerNorm])
@pytest.mark.parametrize("shape", [0, -1, "16", (), (8, 0), True, 8.0, (4, 2.0)])
def test_a_bad_normalized_shape_is_named(cls, shape) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"normalized_shape: expected a positive int or a "
                       r"sequence of them; got " + re.escape(repr(shape))):  # fmt: skip
        cls(shape)


def test_good_normalized_shapes() -> None:
    assert RMSNorm(8).normalized_shape == (8,)
    assert LayerNorm([4, 2]).normalized_shape == (4, 2)
    assert RMSNorm(torch.Size([3, 5])).normalized_shape == (3, 5)


@pytest.mark.parametrize(("cls", "ref"), [(RMSNorm, nn.RMSNorm), (LayerNorm, nn.LayerNorm)])
def test_a_numpy_float_eps_works_as_in_torch(cls, ref) -> None:  # type: ignore[no-untyped-def]
    np = pytest.importorskip("numpy")
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    got = cls(16, eps=np.float32(1e-2))(x)
    torch.testing.assert_close(got, cls(16, eps=float(np.float32(1e-2)))(x), rtol=0, atol=0)
    torch.testing.assert_close(got, ref(16, eps=np.float32(1e-2))(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [RMSNorm, LayerNorm])
def test_a_bool_eps_is_refused_not_run_as_one(cls) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="eps: expected a float; got bool True"):
        cls(16, eps=True)(torch.randn(3, 16))
