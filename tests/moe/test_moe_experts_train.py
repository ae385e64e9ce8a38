"""`moe_experts` under autograd runs `moe_experts_train`: its forward saves the experts'
pre-activation gate / up and the backward reads them instead of recomputing."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_moe_experts import _case, _check, _off_rank

import nki_kernels.ops.moe_experts  # noqa: F401  (registers the ops)
from nki_kernels.runtime.launch import record_launches

F32 = torch.float32


def _expert_launches(seen: list[Any]) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {"fwd": [], "bwd": []}
    for r in seen:
        if r.spec.key.kernel.endswith("moe_mlp_fwd"):
            out["fwd"].append(r.args)
        elif r.spec.key.kernel.endswith("moe_mlp_bwd"):
            out["bwd"].append(r.args)
    return out


@pytest.mark.parametrize("off_rank", [False, True], ids=["all-on-rank", "id-E-slots"])
def test_training_calls_save_gate_up_and_the_backward_reads_it(off_rank: bool) -> None:
    """The recorded call's forward saves gate / up and its backward reads them, with the
    recomputing backward's gradients (fp32: identical sums in the same order); no_grad
    calls and calls with no input requiring grad save nothing."""
    args = _case(150, 64, 96, 8, 2, F32, seed=21)
    if off_rank:
        _off_rank(args, seed=3)
    x, w, ids, wgu, wd = args
    leaves = [a.clone().requires_grad_() for a in (x, w, wgu, wd)]
    grad = torch.randn(150, 64, generator=torch.Generator().manual_seed(2))
    with record_launches() as seen:
        out = torch.ops.nki.moe_experts(leaves[0], leaves[1], ids, leaves[2], leaves[3])
        out.backward(grad)
    runs = _expert_launches(seen)
    assert len(runs["fwd"]) == 1 and runs["fwd"][0][8] is not None  # save_cols
    gate_up = runs["bwd"][0][12]
    assert len(runs["bwd"]) == 1 and gate_up is not None and gate_up.shape[0] == 2 * 96
    recomputed = torch.ops.nki.moe_experts_backward(grad, x, w, ids, wgu, wd)
    dw = recomputed[1].to(w.dtype)
    for name, a, r in zip(("hidden", "weights", "w_gate_up", "w_down"), leaves,
                          (recomputed[0], dw, recomputed[2], recomputed[3])):  # fmt: skip
        assert a.grad is not None
        assert torch.equal(a.grad.nan_to_num(), r.nan_to_num()), name
    for ctx, xs in ((torch.no_grad(), leaves), (torch.enable_grad(), [x, w, wgu, wd])):
        with ctx, record_launches() as seen:
            plain = torch.ops.nki.moe_experts(xs[0], xs[1], ids, xs[2], xs[3])
        runs = _expert_launches(seen)
        assert len(runs["fwd"]) == 1 and runs["fwd"][0][8] is None and not runs["bwd"]
        assert torch.equal(plain, out.detach())


def test_saved_path_matches_the_float64_reference_with_id_e_slots() -> None:
    args = _case(130, 32, 40, 6, 3, F32, seed=11)
    _off_rank(args, seed=12)
    _check(args)


def test_a_saved_gate_up_of_another_plan_is_refused() -> None:
    x, w, ids, wgu, wd = _case(150, 64, 96, 8, 2, F32, seed=21)
    grad = torch.randn(150, 64)
    with pytest.raises(ValueError, match=r"gate_up: expected \[2I, \(NB \+ 2\) \* B\]"):
        torch.ops.nki.moe_experts_backward(grad, x, w, ids, wgu, wd, torch.zeros(192, 128))


def test_compiled_training_call_saves() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(torch.ops.nki.moe_experts, backend="aot_eager", fullgraph=True)
    args = _case(70, 16, 24, 5, 2, F32, seed=8)
    with record_launches() as seen:
        _check(args, fn=compiled)
    runs = _expert_launches(seen)
    assert runs["fwd"] and all(r[8] is not None for r in runs["fwd"])
    assert runs["bwd"] and all(r[12] is not None and r[12].numel() for r in runs["bwd"])
