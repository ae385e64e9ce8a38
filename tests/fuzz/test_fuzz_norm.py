"""Property: the norm ops match float64 references for any shape, dtype, device and mode,
forward and backward, and a non-finite row stays in its row."""

from __future__ import annotations

import references as ref
import torch
from fuzz_support import TOL, assert_rel, count_case, devices, leaf, modes, run
from hypothesis import given
from hypothesis import strategies as st

import nki_kernels.ops.norm  # noqa: F401  (registers the ops)

DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])


@st.composite
def norm_case(draw: st.DrawFn) -> dict:
    op = draw(st.sampled_from(["rms_norm", "layer_norm", "add_rms_norm"]))
    h = draw(st.integers(1, 300))
    lead = draw(st.sampled_from([(), (1,), (2, 3)]))
    n = draw(st.integers(1, 260))
    return {
        "op": op,
        "shape": (*lead, n, h) if lead else (n, h),
        "dtype": draw(DTYPES),
        "weight": draw(st.booleans()),
        "bias": op == "layer_norm" and draw(st.booleans()),
        "eps": draw(st.sampled_from([1e-6, 1e-5, 1e-2])),
        "loc": draw(st.sampled_from([0.0, 3.0])),  # a mean far from 0 (LayerNorm's variance)
        "device": draw(devices),
        "mode": draw(modes),
        "backward": draw(st.booleans()),
        "poison": draw(st.sampled_from([None, float("nan"), float("inf")])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _call(op: str, eps: float):  # type: ignore[no-untyped-def]
    if op == "rms_norm":
        return lambda x, r, w, b: torch.ops.nki.rms_norm(x, w, eps)
    if op == "layer_norm":
        return lambda x, r, w, b: torch.ops.nki.layer_norm(x, w, b, eps)
    return lambda x, r, w, b: torch.ops.nki.add_rms_norm(x, r, w, eps)[0]


def _reference(c: dict, x: torch.Tensor, r: torch.Tensor, w, b) -> torch.Tensor:  # type: ignore[no-untyped-def]
    if c["op"] == "rms_norm":
        return ref.rms_norm(x, w, c["eps"])
    if c["op"] == "layer_norm":
        return ref.layer_norm(x, w, b, c["eps"])
    h = (x.detach() + r.detach()).to(x.dtype)  # h is rounded to x's dtype, as the op's
    return ref.rms_norm(x - x.detach() + r - r.detach() + h.to(torch.float64), w, c["eps"])


@given(norm_case())
def test_norms_match_float64(c: dict) -> None:
    count_case("norm")
    g = torch.Generator().manual_seed(c["seed"])
    dt, h = c["dtype"], c["shape"][-1]
    x = (torch.randn(c["shape"], generator=g) + c["loc"]).to(dt)
    r = torch.randn(c["shape"], generator=g).to(dt)
    w = (1 + 0.3 * torch.randn(h, generator=g)).to(dt) if c["weight"] else None
    b = (0.3 * torch.randn(h, generator=g)).to(dt) if c["bias"] else None
    gy = torch.randn(c["shape"], generator=g).to(dt)
    bad_row = None
    if c["poison"] is not None and x.numel() // h > 1:
        bad_row = int(torch.randint(0, x.numel() // h, (1,), generator=g))
        x.view(-1, h)[bad_row, h // 2] = c["poison"]
    dev, grad = c["device"], c["backward"]
    xs, rs, ws, bs = (leaf(t, dev, grad) for t in (x, r, w, b))
    y = run(_call(c["op"], c["eps"]), c["mode"], xs, rs, ws, bs)
    assert y.device.type == dev and y.dtype == dt
    keep = torch.ones(x.numel() // h, dtype=torch.bool)
    if bad_row is not None:
        keep[bad_row] = False
        rows = (~torch.isfinite(y.detach().cpu().reshape(-1, h))).any(dim=1)
        assert rows.nonzero().flatten().tolist() == [bad_row], "non-finite rows"
    x64, r64 = (t.to(torch.float64).requires_grad_(grad) for t in (x, r))
    w64, b64 = (t.to(torch.float64).requires_grad_(grad) if t is not None else None for t in (w, b))
    want = _reference(c, x64, r64, w64, b64)
    tol_y, tol_g = TOL[dt]
    yk = y.detach().cpu().reshape(-1, h)[keep]
    assert_rel(yk, want.detach().reshape(-1, h)[keep], tol_y, "y")
    if not grad or bad_row is not None:
        return
    y.backward(gy.to(dev))
    want.backward(gy.to(torch.float64))
    assert_rel(xs.grad, x64.grad, tol_g, "dx")
    if c["op"] == "add_rms_norm":
        assert_rel(rs.grad, r64.grad, tol_g, "dresidual")
    if w is not None:
        assert_rel(ws.grad, w64.grad, tol_g, "dweight")
    if b is not None:
        assert_rel(bs.grad, b64.grad, tol_g, "dbias")
