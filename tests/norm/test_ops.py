"""torch.ops.nki.rms_norm / layer_norm / add_rms_norm: forward and autograd against the fp32
references, eagerly, under torch.compile(fullgraph=True) and on the emulated neuron
device; bad input gets an error naming the argument."""

from __future__ import annotations

from typing import Any

import norm_helpers as nh
import pytest
import torch

import nki_kernels.ops.norm  # noqa: F401  (registers the ops)
from nki_kernels.norm import reference as ref
from nki_kernels.runtime import KERNEL_CACHE
from nki_kernels.runtime.buckets import bucket

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


CASES = [
    ((1, 7, 1000), torch.float32),
    ((1, 7, 1000), torch.bfloat16),
    ((1, 7, 1000), torch.float16),
    ((300, 4096), torch.bfloat16),
    ((2, 65, 384), torch.bfloat16),  # 130 rows: not a multiple of 128
]


def _leaf(t: torch.Tensor, device: str = "cpu") -> torch.Tensor:
    return t.detach().to(device).requires_grad_(True)


def _rms_case(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu") -> Any:
    h = shape[-1]
    x = _leaf(nh.make(shape, dtype, 1), device)
    w = _leaf(nh.make((h,), dtype, 2, loc=1.0), device)
    dy = nh.make(shape, dtype, 3).to(device)
    return x, w, dy


def _check_rms(x: Any, w: Any, dy: Any, y: Any, dtype: torch.dtype, where: str) -> None:
    h = x.shape[-1]
    xc, wc, dyc = x.detach().cpu(), w.detach().cpu(), dy.cpu()
    assert y.dtype == dtype and y.shape == x.shape and y.device == x.device
    yr, bound = nh.rms_fwd_bound(xc.reshape(-1, h), wc, *nh.TOL[dtype])
    nh.assert_within(f"{where}: y", y.reshape(-1, h), yr, bound)
    want = nh.rms_bwd_bounds(dyc.reshape(-1, h), xc.reshape(-1, h), wc, *nh.TOL[dtype])
    assert x.grad is not None and w.grad is not None
    assert x.grad.device == x.device and w.grad.device == w.device
    nh.check_all({"dx": x.grad.reshape(-1, h), "dw": w.grad}, want, where)


@pytest.mark.parametrize("shape,dtype", CASES)
def test_rms_norm_eager(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, w, dy = _rms_case(shape, dtype)
    y = torch.ops.nki.rms_norm(x, w, nh.EPS)
    y.backward(dy)
    _check_rms(x, w, dy, y, dtype, "eager")


def test_rms_norm_no_weight_and_wide_rows() -> None:
    x = _leaf(nh.make((3, 43, 16384), torch.bfloat16, 4))  # 129 rows, H = 16384
    dy = nh.make(x.shape, torch.bfloat16, 5)
    y = torch.ops.nki.rms_norm(x, None, nh.EPS)
    y.backward(dy)
    h = x.shape[-1]
    yr, bound = nh.rms_fwd_bound(x.detach().reshape(-1, h), None, *nh.TOL[torch.bfloat16])
    nh.assert_within("y", y.reshape(-1, h), yr, bound)
    want = nh.rms_bwd_bounds(
        dy.reshape(-1, h), x.detach().reshape(-1, h), None, *nh.TOL[torch.bfloat16]
    )
    nh.check_all({"dx": x.grad.reshape(-1, h)}, want, "no weight")


@pytest.mark.parametrize("shape,dtype", CASES[:4])
@pytest.mark.parametrize("affine", ["wb", "none"])
def test_layer_norm_eager(shape: tuple[int, ...], dtype: torch.dtype, affine: str) -> None:
    h = shape[-1]
    x = _leaf(nh.make(shape, dtype, 6, loc=2.0))
    w = _leaf(nh.make((h,), dtype, 7, loc=1.0)) if affine == "wb" else None
    b = _leaf(nh.make((h,), dtype, 8)) if affine == "wb" else None
    dy = nh.make(shape, dtype, 9)
    y = torch.ops.nki.layer_norm(x, w, b, 1e-5)
    y.backward(dy)
    xc = x.detach().reshape(-1, h)
    wc = w.detach() if w is not None else None
    bc = b.detach() if b is not None else None
    yr, bound = nh.ln_fwd_bound(xc, wc, bc, *nh.TOL[dtype])
    nh.assert_within("y", y.reshape(-1, h), yr, bound)
    want = nh.ln_bwd_bounds(dy.reshape(-1, h), xc, wc, bc, *nh.TOL[dtype])
    got = {"dx": x.grad.reshape(-1, h)}
    if w is not None:
        got |= {"dw": w.grad, "db": b.grad}
    nh.check_all(got, want, f"layer_norm {affine}")


@pytest.mark.parametrize("shape,dtype", [CASES[1], CASES[4]])
def test_add_rms_norm_eager(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    h = shape[-1]
    x, r = _leaf(nh.make(shape, dtype, 10)), _leaf(nh.make(shape, dtype, 11))
    w = _leaf(nh.make((h,), dtype, 12, loc=1.0))
    gy, gh = nh.make(shape, dtype, 13), nh.make(shape, dtype, 14)
    y, hs = torch.ops.nki.add_rms_norm(x, r, w, nh.EPS)
    torch.autograd.backward([y, hs], [gy, gh])
    _, hr, _ = ref.add_rms_norm_ref(x.detach(), r.detach(), w.detach(), nh.EPS)
    assert torch.equal(hs, hr)
    yr, bound = nh.rms_fwd_bound(hr.reshape(-1, h), w.detach(), *nh.TOL[dtype])
    nh.assert_within("y", y.reshape(-1, h), yr, bound)
    want = nh.rms_bwd_bounds(gy.reshape(-1, h), hr.reshape(-1, h), w.detach(), *nh.TOL[dtype])
    rdx, bdx = want["dx"]
    ghf = gh.reshape(-1, h).float()
    want["dx"] = (rdx + ghf, bdx + nh.TOL[dtype][0] * ghf.abs())
    nh.check_all({"dx": x.grad.reshape(-1, h), "dw": w.grad}, want, "add_rms_norm")
    assert torch.equal(x.grad, r.grad)


def _model(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y, h = torch.ops.nki.add_rms_norm(x, x * 0.5, w, nh.EPS)
    return torch.ops.nki.layer_norm(torch.ops.nki.rms_norm(y, w, nh.EPS) + h, w, b, 1e-5)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend: str) -> None:
    torch._dynamo.reset()
    h = 256
    x = nh.make((2, 77, h), torch.float32, 15)
    w, b = nh.make((h,), torch.float32, 16, loc=1.0), nh.make((h,), torch.float32, 17)
    leaves_e = [_leaf(t) for t in (x, w, b)]
    leaves_c = [_leaf(t) for t in (x, w, b)]
    eager = _model(*leaves_e)
    compiled = torch.compile(_model, backend=backend, fullgraph=True)(*leaves_c)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    g = nh.make(eager.shape, torch.float32, 18)
    eager.backward(g)
    compiled.backward(g)
    for a, c in zip(leaves_e, leaves_c):
        torch.testing.assert_close(c.grad, a.grad, rtol=0, atol=0)


def test_neuron_device_forward_backward(neuron: str) -> None:
    x, w, dy = _rms_case((2, 65, 384), torch.bfloat16, neuron)
    y = torch.ops.nki.rms_norm(x, w, nh.EPS)
    assert y.device.type == "neuron"
    y.backward(dy)
    _check_rms(x, w, dy, y, torch.bfloat16, "neuron")


def test_neuron_device_torch_compile(neuron: str) -> None:
    torch._dynamo.reset()
    x, w, dy = _rms_case((1, 7, 1000), torch.float32, neuron)
    fn = torch.compile(
        lambda a, b: torch.ops.nki.rms_norm(a, b, nh.EPS), backend="aot_eager", fullgraph=True
    )
    y = fn(x, w)
    y.backward(dy)
    _check_rms(x, w, dy, y, torch.float32, "neuron compiled")


def test_lengths_in_one_bucket_compile_once() -> None:
    w = nh.make((96,), torch.float32, 19)
    KERNEL_CACHE.clear()
    lengths = [130, 150, 200, 255, 256]
    assert len({bucket(n) for n in lengths}) == 1
    for n in lengths:
        torch.ops.nki.rms_norm(nh.make((n, 96), torch.float32, n), w, nh.EPS)
    assert KERNEL_CACHE.compiles == 1


def _bad_calls() -> list[tuple[str, Any, str]]:
    x = torch.randn(4, 64)
    w = torch.randn(64)
    rms, ln, add = torch.ops.nki.rms_norm, torch.ops.nki.layer_norm, torch.ops.nki.add_rms_norm
    return [
        (
            "int x",
            lambda: rms(torch.ones(4, 64, dtype=torch.int32), None, nh.EPS),
            "x: expected dtype",
        ),
        ("fp64 x", lambda: rms(x.double(), None, nh.EPS), "x: expected dtype"),
        ("weight dtype", lambda: rms(x, w.half(), nh.EPS), "weight: expected dtype"),
        (
            "weight shape",
            lambda: rms(x, torch.randn(63), nh.EPS),
            r"weight: expected shape \(64,\)",
        ),
        ("eps zero", lambda: rms(x, w, 0.0), "eps: expected a finite number > 0"),
        ("eps negative", lambda: ln(x, None, None, -1e-5), "eps: expected a finite number > 0"),
        ("empty", lambda: rms(torch.randn(0, 64), w, nh.EPS), "x: expected a non-empty tensor"),
        ("bias shape", lambda: ln(x, w, torch.randn(32), 1e-5), "bias: expected shape"),
        (
            "residual shape",
            lambda: add(x, torch.randn(4, 32), w, nh.EPS),
            "residual: expected shape",
        ),
        ("residual dtype", lambda: add(x, x.half(), w, nh.EPS), "residual: expected dtype"),
    ]


@pytest.mark.parametrize("name,call,message", _bad_calls(), ids=[c[0] for c in _bad_calls()])
def test_bad_input_names_the_argument(name: str, call: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        call()


def test_wrong_device_names_the_argument(neuron: str) -> None:
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="weight: expected device"):
        torch.ops.nki.rms_norm(x, torch.randn(64).to(neuron), nh.EPS)


def test_backward_hidden_limit() -> None:
    x = torch.randn(2, 65537)
    with pytest.raises(
        ValueError,
        match=r"x: expected hidden size \(last dim\) <= 65536 for rms_norm backward .*; got 65537",
    ):
        torch.ops.nki.rms_norm_backward(x, x, None, nh.EPS)
