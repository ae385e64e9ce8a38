"""`moe_gated_experts` above the decode size (T > 64) without gradients, gate and up given
apart (`w_up`: TorchTitan's w1 / w3 [E, I, H] as transposed views; `shared_up`: the
shared expert's nn.Linear gate / up weights as .t() views): no op copies a weight (the
watcher of test_hf_decode_no_copy.py, outside and inside the grouped_mm op's body), each
grouped_mm launch gets a weight's own storage, and the output is the joined weights'
bit for bit. With gradients the weights are still joined (grouped_mm's d x contracts
gate and up in one fp32 sum): the same gradients as before."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_hf_decode_no_copy import _WeightCopies
from torch.utils._python_dispatch import _disable_current_modes

import nki_kernels.ops.grouped_mm as gm_ops
from nki_kernels.ops.moe_gated_experts import moe_gated_experts

F32, BF16 = torch.float32, torch.bfloat16


def _layer(dtype: torch.dtype, t: int = 100, h: int = 48, i: int = 40, e: int = 4,
           k: int = 2, si: int = 24) -> dict[str, Any]:  # fmt: skip
    g = torch.Generator().manual_seed(7)
    r = lambda *s: (torch.randn(*s, generator=g) / 4).to(dtype)  # noqa: E731
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    return {
        "hidden": r(t, h),
        "weights": torch.rand(t, k, generator=g),
        "ids": ids,
        "w1": r(e, i, h),  # gate, up, down stored as TorchTitan's w1 / w3 / w2
        "w3": r(e, i, h),
        "w2": r(e, h, i),
        "s_gate": r(si, h),  # the shared expert's nn.Linear weights [out, in]
        "s_up": r(si, h),
        "s_down": r(h, si),
        "s_gate_logit": r(h),
    }


def _call(c: dict[str, Any], joined: bool, shared: bool) -> torch.Tensor:
    gate, up, down = (c[n].transpose(1, 2) for n in ("w1", "w3", "w2"))
    kw: dict[str, Any] = {}
    if shared:
        sg, su = c["s_gate"].t(), c["s_up"].t()
        kw = {"shared_down": c["s_down"].t(), "shared_gate": c["s_gate_logit"]}
        kw |= {"shared_gate_up": torch.cat([sg, su], 1)} if joined else {
            "shared_gate_up": sg, "shared_up": su}  # fmt: skip
    if joined:
        return moe_gated_experts(
            c["hidden"], c["weights"], c["ids"], torch.cat([gate, up], 2), down, **kw
        )
    return moe_gated_experts(c["hidden"], c["weights"], c["ids"], gate, down, w_up=up, **kw)


@pytest.mark.parametrize("shared", [False, True], ids=["routed", "shared"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_split_gate_up_is_read_in_place(monkeypatch: Any, dtype: torch.dtype, shared: bool) -> None:
    c = _layer(dtype)
    with torch.no_grad():
        ref = _call(c, joined=True, shared=shared)
    routed, shared_ws = ["w1", "w3", "w2"], ["s_gate", "s_up", "s_down", "s_gate_logit"]
    names = routed + shared_ws if shared else routed
    storages = {c[n].untyped_storage().data_ptr(): n for n in names}
    seen: list[str] = []
    launched: list[str] = []
    real_launch, real_fwd = gm_ops.launch, gm_ops.grouped_mm_forward

    def recorded(kernel: Any, *args: Any, **statics: Any) -> Any:
        if kernel.__name__ == "grouped_mm_fwd":
            launched.append(storages.get(args[1].untyped_storage().data_ptr(), "a copy"))
        with _disable_current_modes():  # the interpreter's own host read is not the layer's
            return real_launch(kernel, *args, **statics)

    def watched(*args: Any, **kwargs: Any) -> Any:
        # a custom op's body runs outside the caller's dispatch mode: watched from inside
        with _WeightCopies(set(storages), seen):
            return real_fwd(*args, **kwargs)

    monkeypatch.setattr(gm_ops, "launch", recorded)
    monkeypatch.setattr(gm_ops, "grouped_mm_forward", watched)
    with torch.no_grad(), _WeightCopies(set(storages), seen):
        got = _call(c, joined=False, shared=shared)
    assert seen == [], f"weights copied: {seen}"
    assert torch.equal(got, ref)
    assert launched == names, launched


def test_with_gradients_the_split_call_matches_the_joined_one() -> None:
    c = _layer(BF16)
    grads = []
    for joined in (True, False):
        leaves = {n: c[n].clone().requires_grad_() for n in ("hidden", "w1", "w3", "w2")}
        out = _call({**c, **leaves}, joined=joined, shared=False)
        out.float().square().sum().backward()
        grads.append([out.detach()] + [leaves[n].grad for n in ("hidden", "w1", "w3", "w2")])
    for name, a, b in zip(("out", "d hidden", "d w1", "d w3", "d w2"), *grads):
        assert torch.equal(a, b), name
