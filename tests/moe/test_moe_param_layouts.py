"""The blockwise MoE kernels (prefill / training) on weights in their parameters' layouts:
transformers' [E, 2I, H] / [E, H, I] experts and TorchTitan's w1 / w3 [E, I, H] and w2
[E, H, I] (gate and up as two tensors) read in place (moe/param_layout.py) give the
row-major launch's outputs bit for bit (same matmuls, same order); the ops hand the
Parameters' storage to the launch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from moe_cases import make_layer, plan_for, random_routing

import nki_kernels.ops.moe_launch as launch_ops
from nki_kernels.interp import run
from nki_kernels.moe.blockwise_mlp import moe_mlp_fwd
from nki_kernels.moe.blockwise_mlp_bwd import moe_mlp_bwd
from nki_kernels.moe.grouping import gate_up_columns
from nki_kernels.moe.split_kernels import moe_mlp_bwd_split

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
F32, BF16 = torch.float32, torch.bfloat16
FWD = {"tile_i": 256, "loop_order": "h_outer", "down_n": 512, "w_bufs": 2, "dma_h": 1}

CASES = {
    # name: (T, H, I, E, k, dtype, config overrides)
    "ragged-bf16": (37, 200, 300, 4, 2, BF16, {}),
    "ragged-fp32": (37, 200, 300, 4, 2, F32, {}),  # 4-byte: natural loads + PE transposes
    "i-outer-bf16": (140, 64, 96, 8, 2, BF16, {"loop_order": "i_outer"}),
    "chunks-bf16": (130, 256, 640, 4, 2, BF16, {"w_bufs": 3, "dma_h": 2}),
}


def stored(layer: dict[str, torch.Tensor], layout: str) -> tuple[Any, Any, Any, tuple[bool, bool]]:
    """(w_gate_up, w_down, w_up, transposed) as the kernel takes them for `layout`:
    'hf' (gate_up [E, 2I, H], down [E, H, I]), 'hf-gate-up' (down row-major),
    'hf-down' (gate_up row-major), 'split' (gate, up [E, H, I] row-major), 'titan'
    (w1 / w3 [E, I, H], w2 [E, H, I])."""
    wgu, wd = layer["w_gate_up"], layer["w_down"]
    i = wd.shape[1]
    t = lambda w: w.transpose(1, 2).contiguous()  # noqa: E731
    gate, up = wgu[:, :, :i].contiguous(), wgu[:, :, i:].contiguous()
    return {
        "hf": (t(wgu), t(wd), None, (True, True)),
        "hf-gate-up": (t(wgu), wd, None, (True, False)),
        "hf-down": (wgu, t(wd), None, (False, True)),
        "split": (gate, wd, up, (False, False)),
        "titan": (t(gate), t(wd), t(up), (True, True)),
    }[layout]


def fwd(layer: dict[str, torch.Tensor], ws: tuple[Any, ...], save: Any, lnc: int = 1,
        **cfg: Any) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """The training forward (gate / up saved) on one sized plan: (out, gate_up)."""
    wgu, wd, wup, transposed = ws
    plan, cols = save
    t = torch.from_numpy
    res = run(
        moe_mlp_fwd, layer["hidden"], wgu, wd, t(plan.slot_token), t(plan.block_expert),
        t(plan.kind_bounds), t(plan.token_slot), t(plan.token_weight), t(cols[0]), t(cols[1]),
        None, plan.may_drop, plan.block_size, *{**FWD, **cfg}.values(), None, wup, transposed,
        lnc=lnc,
    )  # fmt: skip
    return tuple(res.outputs)


def _setup(case: str) -> tuple[dict[str, torch.Tensor], Any, dict[str, Any]]:
    t, h, i, e, k, dt, cfg = CASES[case]
    layer = make_layer(t, h, i, e, dt)
    ids, w = random_routing(t, e, k, seed=1)
    plan = plan_for(ids, w, e, 128, sized=True)
    cols = gate_up_columns(plan, plan_for(ids, w, e, 128))
    return layer, (plan, cols), cfg


@pytest.mark.parametrize("layout", ["hf", "hf-gate-up", "hf-down", "split", "titan"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_in_param_layout_is_bit_identical(case: str, layout: str) -> None:
    layer, save, cfg = _setup(case)
    ref = fwd(layer, (layer["w_gate_up"], layer["w_down"], None, (False, False)), save, **cfg)
    got = fwd(layer, stored(layer, layout), save, **cfg)
    for name, r, g in zip(("out", "gate_up"), ref, got):
        assert torch.equal(r, g), f"{case} {layout}: {name} differs"


@pytest.mark.parametrize("layout", ["hf", "titan"])
def test_forward_in_param_layout_lnc2(layout: str) -> None:
    layer, save, _ = _setup("ragged-bf16")
    ref = fwd(layer, (layer["w_gate_up"], layer["w_down"], None, (False, False)), save)
    got = fwd(layer, stored(layer, layout), save, lnc=2)
    assert all(torch.equal(r, g) for r, g in zip(ref, got))


def _recorded(monkeypatch: Any) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    real = launch_ops.launch

    def rec(kernel: Any, *args: Any, **kw: Any) -> Any:
        calls.append((kernel.__name__, args, kw))
        return real(kernel, *args, **kw)

    monkeypatch.setattr(launch_ops, "launch", rec)
    return calls


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_ops_pass_transposed_views_without_copy(monkeypatch: Any, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    t, h, i, e = 100, 64, 96, 4
    x = torch.randn(t, h, generator=g).to(dtype)
    logits = torch.randn(t, e, generator=g)
    s_gu = (torch.randn(e, 2 * i, h, generator=g) / 8).to(dtype)  # transformers' storage
    s_d = (torch.randn(e, h, i, generator=g) / 8).to(dtype)
    w = torch.rand(t, 2, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(t)])
    ref_mlp = torch.ops.nki.moe_mlp(
        x, logits, s_gu.transpose(1, 2).contiguous(), s_d.transpose(1, 2).contiguous(), top_k=2
    )
    ref_exp = torch.ops.nki.moe_experts(
        x, w, ids, s_gu.transpose(1, 2).contiguous(), s_d.transpose(1, 2).contiguous()
    )
    calls = _recorded(monkeypatch)
    got_mlp = torch.ops.nki.moe_mlp(x, logits, s_gu.transpose(1, 2), s_d.transpose(1, 2), top_k=2)
    got_exp = torch.ops.nki.moe_experts(x, w, ids, s_gu.transpose(1, 2), s_d.transpose(1, 2))
    assert torch.equal(got_mlp, ref_mlp) and torch.equal(got_exp, ref_exp)
    fwd_calls = [(a, kw) for n, a, kw in calls if n == "moe_mlp_fwd"]
    assert len(fwd_calls) == 2
    for args, kw in fwd_calls:
        assert kw["transposed"] == (True, True)
        assert args[1].data_ptr() == s_gu.data_ptr() and args[2].data_ptr() == s_d.data_ptr()


BWD = {"sub_block": 128, "tile_i": 256, "dma_h": 1, "w_bufs": 2, "wgrad_tiles": 1,
       "wgrad_cols": 512, "strip_bufs": 3, "prefetch_rows": 1}  # fmt: skip
BWD_CASES = {
    # name: (T, H, I, E, k, dtype, config overrides)
    "ragged-bf16": (37, 200, 300, 4, 2, BF16, {"dma_h": 2, "wgrad_tiles": 2}),
    "ragged-fp32": (37, 200, 300, 4, 2, F32, {}),
    "chunks-bf16": (130, 256, 640, 4, 2, BF16, {"wgrad_cols": 256}),
}


def bwd(layer: dict[str, torch.Tensor], plan: Any, ws: tuple[Any, ...], lnc: int = 1,
        **cfg: Any) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """(dx, d weights, dW_gate_up, dW_down) of the backward kernel on weights `ws`
    (`stored`), the weight gradients as [E, H, 2I] / [E, I, H] (gate and up joined)."""
    wgu, wd, wup, transposed = ws
    dgu, dd = torch.zeros_like(wgu), torch.zeros_like(wd)
    dup = None if wup is None else torch.zeros_like(wup)
    t = torch.from_numpy
    meta = (t(plan.slot_token), t(plan.slot_weight), t(plan.block_expert), t(plan.block_keep),
            t(plan.block_count), t(plan.token_slot))  # fmt: skip
    tail = (plan.static_blocks, plan.may_drop, plan.block_size, *{**BWD, **cfg}.values())
    x, dout = layer["hidden"], layer["dout"]
    if wup is None:
        args = (x, wgu, wd, dout, *meta, dgu, dd, None, *tail, None, None, transposed)
        dx, dw = run(moe_mlp_bwd, *args, lnc=lnc).outputs
    else:
        args = (x, wgu, wup, wd, dout, *meta, dgu, dup, dd, None, *tail, transposed)
        dx, dw = run(moe_mlp_bwd_split, *args, lnc=lnc).outputs
    gu_t, dn_t = transposed
    if dup is not None:
        dgu = torch.cat([dgu, dup], dim=1 if gu_t else 2)
    return dx, dw, dgu.transpose(1, 2) if gu_t else dgu, dd.transpose(1, 2) if dn_t else dd


@pytest.mark.parametrize("layout", ["hf", "hf-gate-up", "hf-down", "split", "titan"])
@pytest.mark.parametrize("case", sorted(BWD_CASES))
def test_backward_in_param_layout_is_bit_identical(case: str, layout: str) -> None:
    t, h, i, e, k, dt, cfg = BWD_CASES[case]
    layer = make_layer(t, h, i, e, dt)
    ids, w = random_routing(t, e, k, seed=1)
    plan = plan_for(ids, w, e, 128)
    ref = bwd(layer, plan, (layer["w_gate_up"], layer["w_down"], None, (False, False)), **cfg)
    got = bwd(layer, plan, stored(layer, layout), **cfg)
    for name, r, g in zip(("dx", "d weights", "dW_gate_up", "dW_down"), ref, got):
        assert torch.equal(r, g), f"{case} {layout}: {name} differs"


def test_backward_in_param_layout_lnc2() -> None:
    t, h, i, e, k, dt, cfg = BWD_CASES["ragged-bf16"]
    layer = make_layer(t, h, i, e, dt)
    ids, w = random_routing(t, e, k, seed=1)
    plan = plan_for(ids, w, e, 128)
    ref = bwd(layer, plan, (layer["w_gate_up"], layer["w_down"], None, (False, False)), **cfg)
    for layout in ("hf", "titan"):
        got = bwd(layer, plan, stored(layer, layout), lnc=2, **cfg)
        assert all(torch.equal(r, g) for r, g in zip(ref, got)), layout


@pytest.mark.parametrize("op", ["moe_mlp", "moe_experts"])
def test_training_step_grads_in_param_layout(monkeypatch: Any, op: str) -> None:
    """Under autograd (the training route: forward saves gate / up, the backward reads
    the weights in place): outputs and every gradient equal the row-major weights', and
    the weight gradients come back in the parameters' layout."""
    g = torch.Generator().manual_seed(3)
    t, h, i, e = 100, 64, 96, 4
    x = torch.randn(t, h, generator=g).bfloat16()
    logits = torch.randn(t, e, generator=g)
    w = torch.rand(t, 2, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(t)])
    s_gu = (torch.randn(e, 2 * i, h, generator=g) / 8).bfloat16()
    s_d = (torch.randn(e, h, i, generator=g) / 8).bfloat16()
    dout = torch.randn(t, h, generator=g).bfloat16()

    def step(gu: torch.Tensor, d: torch.Tensor, views: bool) -> list[torch.Tensor]:
        gu, d = gu.clone().requires_grad_(), d.clone().requires_grad_()
        xs = x.clone().requires_grad_()
        a, b = (gu.transpose(1, 2), d.transpose(1, 2)) if views else (gu, d)
        if op == "moe_mlp":
            out = torch.ops.nki.moe_mlp(xs, logits, a, b, top_k=2)
        else:
            out = torch.ops.nki.moe_experts(xs, w, ids, a, b)
        out.backward(dout)
        assert gu.grad is not None and d.grad is not None and xs.grad is not None
        if views:  # the storage's gradients, seen as [E, H, 2I] / [E, I, H]
            return [out, xs.grad, gu.grad.transpose(1, 2), d.grad.transpose(1, 2)]
        return [out, xs.grad, gu.grad, d.grad]

    ref = step(s_gu.transpose(1, 2).contiguous(), s_d.transpose(1, 2).contiguous(), False)
    calls = _recorded(monkeypatch)
    got = step(s_gu, s_d, views=True)
    for name, r, o in zip(("out", "dx", "dW_gate_up", "dW_down"), ref, got):
        assert torch.equal(r, o), f"{op}: {name} differs"
    names = [n for n, _, _ in calls]
    assert "moe_mlp_fwd" in names and "moe_mlp_bwd" in names, names
    for n, args, kw in calls:
        if n in ("moe_mlp_fwd", "moe_mlp_bwd"):
            assert kw["transposed"] == (True, True), n
            assert args[1].shape == s_gu.shape and args[2].shape == s_d.shape, n
