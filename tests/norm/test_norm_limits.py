"""The hidden-size range of the norm ops (issue 15, cases 1 and 2) and non-finite rows.

- LayerNorm backward with weight and bias in bf16 / fp16 above H = 16384 (it ran out of
  PSUM banks storing the column sums) against the fp32 reference bounds;
- every limit of `norm.limits.max_hidden` is the one the README states, enforced up
  front with an error naming x, the limit and the value, and the op runs at the limit;
- a NaN / Inf row of x or of the gradient stays in its row.
"""

from __future__ import annotations

import re
from pathlib import Path

import norm_helpers as nh
import pytest
import torch

import nki_kernels.ops.norm  # noqa: F401  (registers the ops)
from nki_kernels.norm.limits import max_hidden

README = Path(__file__).resolve().parents[2] / "docs" / "readme" / "norms.md"
NAMES = {
    "`rms_norm`, no weight": ("rms_norm", "none"),
    "`rms_norm`, weight": ("rms_norm", "w"),
    "`add_rms_norm`, no weight": ("add_rms_norm", "none"),
    "`add_rms_norm`, weight": ("add_rms_norm", "w"),
    "`layer_norm`, no parameters": ("layer_norm", "none"),
    "`layer_norm`, weight": ("layer_norm", "w"),
    "`layer_norm`, bias": ("layer_norm", "b"),
    "`layer_norm`, weight and bias": ("layer_norm", "wb"),
}


@pytest.mark.parametrize(("dtype", "h"), [(torch.bfloat16, 16385), (torch.float16, 20000)])
def test_layer_norm_backward_above_16384(dtype: torch.dtype, h: int) -> None:
    x = nh.make((3, h), dtype, seed=h).requires_grad_(True)
    w = (1.0 + 0.1 * nh.make((h,), torch.float32, seed=1)).to(dtype).requires_grad_(True)
    b = (0.1 * nh.make((h,), torch.float32, seed=2)).to(dtype).requires_grad_(True)
    dy = nh.make((3, h), dtype, seed=3)
    torch.ops.nki.layer_norm(x, w, b, 1e-5).backward(dy)
    u, tiny = nh.TOL[dtype]
    want = nh.ln_bwd_bounds(dy, x.detach(), w.detach(), b.detach(), u, tiny)
    nh.check_all({"dx": x.grad, "dw": w.grad, "db": b.grad}, want, f"H={h} {dtype}")


def _cell(text: str) -> tuple[int, int]:
    """'46736 / 54400' -> (trn2, trn3); '65536' -> both; '1048576+' -> the search cap."""
    parts = [int(p.strip().rstrip("+")) for p in text.split("/")]
    return (parts[0], parts[-1])


def test_readme_states_every_limit() -> None:
    rows = {}
    for line in README.read_text().splitlines():
        m = re.match(r"\| (`[a-z_]+`, [a-z ]+) \|(.*)\|$", line)
        if m and m.group(1) in NAMES:
            rows[NAMES[m.group(1)]] = [c.strip() for c in m.group(2).split("|")]
    assert set(rows) == set(NAMES.values()), "README limits table is missing rows"
    for (op, affine), cells in rows.items():
        for cell, (dtype, backward) in zip(
            cells, [("float32", False), ("float32", True), ("bfloat16", False), ("bfloat16", True)]
        ):
            for target, stated in zip(("trn2", "trn3"), _cell(cell)):
                got = max_hidden(op, backward, dtype, affine, target)
                assert got == stated, f"{op} {affine} {dtype} bwd={backward} {target}: {got}"
                if dtype == "bfloat16":
                    assert max_hidden(op, backward, "float16", affine, target) == got


def test_limits_are_monotone_boundaries() -> None:
    """Below a limit every sampled H has a plan (the bisection's premise)."""
    from nki_kernels.norm.limits import _fits

    g = torch.Generator().manual_seed(0)
    for op, affine in NAMES.values():
        for dtype, backward in (("float32", False), ("bfloat16", True)):
            limit = max_hidden(op, backward, dtype, affine, "trn2")
            for h in [*torch.randint(1, limit + 1, (24,), generator=g).tolist(), limit]:
                assert _fits(op, backward, h, dtype, affine, "trn2"), (op, affine, dtype, h)


def test_forward_limit_is_enforced_up_front() -> None:
    h = max_hidden("layer_norm", False, "float32", "wb", "trn2")
    x, w, b = torch.randn(2, h + 1), torch.randn(h + 1), torch.randn(h + 1)
    msg = rf"x: expected hidden size \(last dim\) <= {h} for layer_norm forward .*; got {h + 1}"
    with pytest.raises(ValueError, match=msg):
        torch.ops.nki.layer_norm(x, w, b, 1e-5)
    hr = max_hidden("rms_norm", False, "float32", "w", "trn2")
    with pytest.raises(ValueError, match=rf"<= {hr} for rms_norm forward .*; got {hr + 1}"):
        torch.ops.nki.rms_norm(torch.randn(1, hr + 1), torch.randn(hr + 1), 1e-6)
    y = torch.ops.nki.layer_norm(x[:, :h], w[:h], b[:h], 1e-5)
    u, tiny = nh.TOL[torch.float32]
    ref, bound = nh.ln_fwd_bound(x[:, :h], w[:h], b[:h], u, tiny)
    nh.assert_within("y at the limit", y, ref, bound)


def test_backward_limit_is_enforced_up_front() -> None:
    h = max_hidden("rms_norm", True, "float32", "w", "trn2")
    x, w = torch.randn(1, h + 1), torch.randn(h + 1)
    with pytest.raises(ValueError, match=rf"x: .* <= {h} for rms_norm backward .*; got {h + 1}"):
        torch.ops.nki.rms_norm_backward(torch.randn(1, h + 1), x, w, 1e-6)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_row_stays_in_its_row(op: str, bad: float) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 96, generator=g)
    res = torch.randn(200, 96, generator=g)
    w = torch.randn(96, generator=g)
    dy = torch.randn(200, 96, generator=g)
    x[3, 5] = bad
    dy[7, 1] = bad

    def run(xx: torch.Tensor, gg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xx = xx.clone().requires_grad_(True)
        if op == "rms_norm":
            y = torch.ops.nki.rms_norm(xx, w, 1e-6)
        elif op == "layer_norm":
            y = torch.ops.nki.layer_norm(xx, w, None, 1e-5)
        else:
            y = torch.ops.nki.add_rms_norm(xx, res, w, 1e-6)[0]
        y.backward(gg)
        assert xx.grad is not None
        return y.detach(), xx.grad

    y, dx = run(x, dy)
    bad_y = (~torch.isfinite(y)).any(1).nonzero().flatten().tolist()
    bad_dx = (~torch.isfinite(dx)).any(1).nonzero().flatten().tolist()
    assert bad_y == [3] and bad_dx == [3, 7], (bad_y, bad_dx)
    xc, dyc = x.clone(), dy.clone()
    xc[3], dyc[7] = 0.0, 0.0
    yc, dxc = run(xc, dyc)
    keep = [r for r in range(200) if r not in (3, 7)]
    torch.testing.assert_close(y[keep], yc[keep], atol=0.0, rtol=0.0)
    torch.testing.assert_close(dx[keep], dxc[keep], atol=0.0, rtol=0.0)
