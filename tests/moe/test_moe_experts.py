"""torch.ops.nki.moe_experts: the expert kernels on given routing, forward and backward
against a float64 loop, up to 512 experts and k = 16, NaN rows, id E slots (not on this
rank), torch.compile."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import nki_kernels.ops.moe_experts  # noqa: F401  (registers the op)

F32, BF16 = torch.float32, torch.bfloat16
TOL = {F32: 2e-5, BF16: 2.0**-6}  # relative to the largest magnitude; bf16: 3 roundings

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def reference(x: Any, w: Any, ids: Any, wgu: Any, wd: Any) -> torch.Tensor:
    i = wgu.shape[2] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e == wgu.shape[0]:  # not on this rank: no term at all
                continue
            gu = x[t] @ wgu[e]
            out[t] = out[t] + w[t, j] * ((F.silu(gu[:i]) * gu[i:]) @ wd[e])
    return out


def _case(t: int, h: int, i: int, e: int, k: int, dtype: torch.dtype, seed: int = 0) -> list[Any]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    w = torch.rand(t, k, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    wgu = (torch.randn(e, h, 2 * i, generator=g) / h**0.5).to(dtype)
    wd = (torch.randn(e, i, h, generator=g) / i**0.5).to(dtype)
    return [x, w, ids, wgu, wd]


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    scale = max(1e-3, float(b.detach().abs().max()))
    err = float((a.double() - b.detach()).abs().max()) / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]:.3g}"


def _check(args: list[Any], fn: Any = None) -> None:
    x, w, ids, wgu, wd = args
    dtype = x.dtype
    leaves = [a.clone().requires_grad_() for a in (x, w, wgu, wd)]
    op = fn or torch.ops.nki.moe_experts
    out = op(leaves[0], leaves[1], ids, leaves[2], leaves[3])
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    out.backward(dy)
    refs = [a.double().requires_grad_() for a in (x, w, wgu, wd)]
    ref = reference(refs[0], refs[1], ids, refs[2], refs[3])
    ref.backward(dy.double())
    _close(out, ref, dtype, "out")
    for name, a, r in zip(("hidden", "weights", "w_gate_up", "w_down"), leaves, refs):
        assert a.grad is not None and r.grad is not None and a.grad.dtype == a.dtype
        if name == "weights":  # NaN / Inf weights on id E slots: compared where finite
            a.grad[~torch.isfinite(w)] = r.grad[~torch.isfinite(w)].to(a.grad.dtype)
        _close(a.grad, r.grad, dtype, f"d {name}")
    off = ids == wgu.shape[0]
    assert bool((leaves[1].grad[off] == 0).all()), "a slot not on this rank got a gradient"


@pytest.mark.parametrize(
    ("t", "h", "i", "e", "k", "dtype"),
    [
        (37, 32, 48, 6, 3, F32),
        (20, 16, 24, 300, 10, BF16),  # DeepSeek-sized expert count, k > 8
        (9, 16, 24, 512, 16, F32),  # the limits: 512 experts, k = 16
    ],
)
def test_matches_the_float64_reference(t: int, h: int, i: int, e: int, k: int, dtype: Any) -> None:
    _check(_case(t, h, i, e, k, dtype))


def test_every_token_on_one_expert_and_empty_experts() -> None:
    args = _case(140, 16, 24, 8, 1, F32, seed=2)
    args[2] = torch.full((140, 1), 5)
    _check(args)


def test_nan_weight_stays_in_its_row() -> None:
    x, w, ids, wgu, wd = _case(40, 16, 24, 4, 2, F32, seed=3)
    w[6, 1] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.ops.nki.moe_experts(x, w, ids, wgu, wd)
    assert (~torch.isfinite(out)).any(dim=1).nonzero().flatten().tolist() == [6]


def _off_rank(args: list[Any], seed: int) -> torch.Tensor:
    """Slots of ~40% of the assignments (and all of token 3's) set to id E (not on this
    rank: transformers' expert-parallel mask) with NaN / Inf weights; returns the mask."""
    e = args[3].shape[0]
    off = torch.rand(args[2].shape, generator=torch.Generator().manual_seed(seed)) < 0.4
    off[3] = True
    args[2] = torch.where(off, e, args[2])
    args[1] = torch.where(off, torch.tensor(float("nan")), args[1])
    args[1][off.nonzero()[::2].unbind(1)] = float("inf")
    return off


@pytest.mark.parametrize("t", [19, 70], ids=["decode-mode", "block-plan"])
def test_id_e_slots_contribute_nothing(t: int) -> None:
    args = _case(t, 16, 24, 5, 3, F32, seed=6)
    _off_rank(args, seed=t)
    _check(args)


@pytest.mark.parametrize("t", [19, 70], ids=["decode-mode", "block-plan"])
def test_id_e_only_token_with_nan_hidden_gives_zeros(t: int) -> None:
    x, w, ids, wgu, wd = _case(t, 16, 24, 5, 3, F32, seed=7)
    args = [x, w, ids, wgu, wd]
    _off_rank(args, seed=t + 1)
    args[0][3] = float("nan")  # token 3: no expert here, so its row must stay out
    leaves = [a.clone().requires_grad_() for a in (args[0], args[1], wgu, wd)]
    out = torch.ops.nki.moe_experts(leaves[0], leaves[1], args[2], leaves[2], leaves[3])
    assert bool((out[3] == 0).all()) and bool(torch.isfinite(out).all())
    out.backward(torch.ones_like(out))
    for a in leaves[2:]:
        assert a.grad is not None and bool(torch.isfinite(a.grad).all())
    assert leaves[1].grad is not None and bool((leaves[1].grad[args[2] == 5] == 0).all())


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_id_e_slots_compiled(device: str, request: pytest.FixtureRequest) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    compiled = torch.compile(torch.ops.nki.moe_experts, backend="aot_eager", fullgraph=True)
    args = _case(70, 16, 24, 5, 2, F32, seed=8)
    _off_rank(args, seed=9)
    moved = [a.to(device) for a in args]
    leaves = [a.clone().requires_grad_() for a in (moved[0], moved[1], moved[3], moved[4])]
    out = compiled(leaves[0], leaves[1], moved[2], leaves[2], leaves[3])
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    out.backward(dy.to(device))
    refs = [a.double().requires_grad_() for a in (args[0], args[1], args[3], args[4])]
    ref = reference(refs[0], refs[1], args[2], refs[2], refs[3])
    ref.backward(dy.double())
    _close(out.cpu(), ref, F32, "out")
    for name, i in (("hidden", 0), ("w_gate_up", 2), ("w_down", 3)):
        grad, rgrad = leaves[i].grad, refs[i].grad
        assert grad is not None and rgrad is not None
        _close(grad.cpu(), rgrad, F32, f"d {name}")
    assert leaves[1].grad is not None
    assert bool((leaves[1].grad.cpu()[args[2] == 5] == 0).all())


def test_torch_compile_fullgraph() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(torch.ops.nki.moe_experts, backend="aot_eager", fullgraph=True)
    _check(_case(45, 32, 40, 5, 2, F32, seed=4), fn=compiled)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda a: a.__setitem__(2, a[2] + 100),
            r"ids: expected expert ids in \[0, 6\] \(6: not on this rank\)",
        ),
        (lambda a: a.__setitem__(1, a[1][:, :2]), r"weights: expected shape \(37, 3\)"),
        (lambda a: a.__setitem__(4, a[4][:, :5]), "w_down: expected"),
        (lambda a: a.__setitem__(3, a[3].bfloat16()), "w_gate_up: expected dtype"),
    ],
)
def test_bad_input_names_the_argument(edit: Any, match: str) -> None:
    args = _case(37, 32, 48, 6, 3, F32)
    edit(args)
    with pytest.raises((ValueError, TypeError), match=match):
        torch.ops.nki.moe_experts(*args)
