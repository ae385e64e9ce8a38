"""Property: moe_route and moe_mlp match float64 references for any token count, experts,
top-k, scoring, capacity, dtype, device and mode, forward and backward; ties go to the
lower expert; empty experts and dropped tokens contribute nothing; a non-finite token
stays in its row.

Logits are drawn on a grid of 0.25 steps: scores either tie exactly (equal logits) or
differ far beyond fp32 rounding, so the selection is the same in fp32 and float64.
"""

from __future__ import annotations

import references as ref
import torch
from fuzz_support import assert_rel, count_case, devices, leaf, modes, run
from hypothesis import given
from hypothesis import strategies as st

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)

NAN, INF = float("nan"), float("inf")


def _grid_logits(t: int, e: int, spread: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(-spread, spread + 1, (t, e), generator=g).float() * 0.25


@st.composite
def route_case(draw: st.DrawFn) -> dict:
    e = draw(st.integers(2, 16))
    return {
        "t": draw(st.integers(1, 300)),
        "e": e,
        "k": draw(st.integers(1, min(e, 8))),
        "scoring": draw(st.sampled_from(["softmax", "sigmoid"])),
        "renormalize": draw(st.booleans()),
        "spread": draw(st.sampled_from([1, 4, 12])),  # 1: many ties
        "dtype": draw(st.sampled_from([torch.float32, torch.bfloat16])),
        "device": draw(devices),
        "mode": draw(modes),
        "poison": draw(st.sampled_from([None, NAN, INF, -INF])),
        "seed": draw(st.integers(0, 2**16)),
    }


@given(route_case())
def test_route_matches_float64(c: dict) -> None:
    count_case("moe_route")
    g = torch.Generator().manual_seed(c["seed"])
    t, e, k = c["t"], c["e"], c["k"]
    lg = _grid_logits(t, e, c["spread"], g).to(c["dtype"])
    bad = None
    if c["poison"] is not None:
        bad = int(torch.randint(0, t, (1,), generator=g))
        lg[bad, int(torch.randint(0, e, (1,), generator=g))] = c["poison"]
        if c["poison"] == -INF and bool(torch.rand(1, generator=g) < 0.5):
            lg[bad] = -INF  # a row of only -inf
    opts = {"top_k": k, "scoring": c["scoring"], "renormalize": c["renormalize"]}
    grad = c["poison"] is None and bool(torch.rand(1, generator=g) < 0.5)
    ls = leaf(lg, c["device"], grad)
    w, ids = run(lambda x: torch.ops.nki.moe_route(x, **opts), c["mode"], ls)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.device.type == c["device"]
    ids_c = ids.cpu().long()
    assert int(ids_c.min()) >= 0 and int(ids_c.max()) < e, "expert ids out of range"
    for row in ids_c.tolist():
        assert len(set(row)) == k, f"repeated expert in {row}"
    lg64 = lg.to(torch.float64).requires_grad_(grad)
    w64, ids64 = ref.route(lg64, k, c["scoring"], c["renormalize"])
    finite = torch.isfinite(w64.detach()).all(dim=1)
    nan_rows = torch.isnan(w.detach().cpu()).all(dim=1)
    assert torch.equal(nan_rows, ~finite), "non-finite routing rows"
    assert torch.equal(ids_c[finite], ids64[finite]), "selection (ties -> lower expert id)"
    assert_rel(w.detach().cpu()[finite], w64.detach()[finite], 4 * 2.0**-24, "weights")
    if not grad:
        return
    dw = torch.randn(t, k, generator=g)
    w.backward(dw.to(c["device"]))
    w64.backward(dw.to(torch.float64))
    tol = 1e-5 if c["dtype"] == torch.float32 else 2.0**-8
    assert_rel(ls.grad, lg64.grad, tol, "d router_logits")


@st.composite
def mlp_case(draw: st.DrawFn) -> dict:
    e = draw(st.integers(2, 8))
    return {
        "t": draw(st.integers(1, 200)),
        "h": draw(st.sampled_from([16, 32, 48])),
        "i": draw(st.sampled_from([16, 32])),
        "e": e,
        "k": draw(st.integers(1, min(e, 4))),
        "scoring": draw(st.sampled_from(["softmax", "sigmoid"])),
        "renormalize": draw(st.booleans()),
        "cf": draw(st.sampled_from([None, None, 0.5, 1.0, 2.0])),
        "spread": draw(st.sampled_from([1, 8])),
        "skew": draw(st.booleans()),  # most tokens to expert 0: empty experts, drops
        "dtype": draw(st.sampled_from([torch.float32, torch.bfloat16])),
        "device": draw(devices),
        "mode": draw(modes),
        "backward": draw(st.booleans()),
        "poison": draw(st.sampled_from([None, None, NAN, INF])),
        "seed": draw(st.integers(0, 2**16)),
    }


@given(mlp_case())
def test_moe_mlp_matches_float64(c: dict) -> None:
    count_case("moe_mlp")
    g = torch.Generator().manual_seed(c["seed"])
    t, h, i, e, dt = c["t"], c["h"], c["i"], c["e"], c["dtype"]
    x = torch.randn(t, h, generator=g).to(dt)
    lg = _grid_logits(t, e, c["spread"], g)
    if c["skew"]:
        lg[:, 0] += 4.0
    wgu = (torch.randn(e, h, 2 * i, generator=g) / h**0.5).to(dt)
    wd = (torch.randn(e, i, h, generator=g) / i**0.5).to(dt)
    gy = torch.randn(t, h, generator=g).to(dt)
    bad = None
    if c["poison"] is not None:
        bad = int(torch.randint(0, t, (1,), generator=g))
        x[bad, 0] = c["poison"]
    opts = {
        "top_k": c["k"],
        "scoring": c["scoring"],
        "renormalize": c["renormalize"],
        "capacity_factor": c["cf"],
    }
    grad = c["backward"] and bad is None
    dev = c["device"]
    xs, ls, ws, ds = (leaf(a, dev, grad) for a in (x, lg, wgu, wd))
    out = run(lambda *a: torch.ops.nki.moe_mlp(*a, **opts), c["mode"], xs, ls, ws, ds)
    assert out.device.type == dev and out.dtype == dt
    args64 = [a.to(torch.float64).requires_grad_(grad) for a in (x, lg, wgu, wd)]
    if bad is not None:
        args64[0] = args64[0].detach().clone()
        args64[0][bad] = 0.0
    want = ref.moe(*args64, c["k"], c["scoring"], c["renormalize"], c["cf"])
    tol_o, tol_g = (1e-5, 4e-5) if dt == torch.float32 else (4 * 2.0**-8, 8 * 2.0**-8)
    got = out.detach().cpu()
    if bad is not None:
        rows = (~torch.isfinite(got)).any(dim=1).nonzero().flatten().tolist()
        kept = bool(ref.capacity_keep(ref.route(lg, c["k"], c["scoring"], c["renormalize"])[1],
                                      e, c["cf"])[bad].any())  # fmt: skip
        assert rows == ([bad] if kept else []), f"non-finite rows {rows} (token {bad})"
        keep = torch.ones(t, dtype=torch.bool)
        keep[bad] = False
        assert_rel(got[keep], want.detach()[keep], tol_o, "out")
        return
    assert_rel(got, want, tol_o, "out")
    if not grad:
        return
    out.backward(gy.to(dev))
    want.backward(gy.to(torch.float64))
    for name, a, a64 in zip(("d hidden", "d logits", "d w_gate_up", "d w_down"), (xs, ls, ws, ds),
                            args64):  # fmt: skip
        assert_rel(a.grad, a64.grad, tol_g, name)
