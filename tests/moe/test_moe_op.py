"""torch.ops.nki.moe_mlp / moe_route: eager, torch.compile, emulated neuron device, errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from moe_cases import assert_close_scaled, make_layer

import nki_kernels.ops.moe  # noqa: F401  (registers the ops)
from nki_kernels.moe.blockwise_mlp import moe_mlp_fwd
from nki_kernels.moe.reference import moe_reference, route_reference
from nki_kernels.runtime import KERNEL_CACHE

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
F32, BF16 = torch.float32, torch.bfloat16


def _inputs(
    t: int, h: int, i: int, e: int, dtype: torch.dtype, seed: int, bias: Any = None
) -> list[torch.Tensor]:
    layer = make_layer(t, h, i, e, dtype, seed)
    logits = layer["logits"]
    if bias is not None:
        logits = logits + torch.as_tensor(bias, dtype=torch.float32)
    return [layer["hidden"], logits.to(dtype), layer["w_gate_up"], layer["w_down"]]


def _check_fwd_bwd(
    args: list[torch.Tensor], dtype: torch.dtype, device: str = "cpu", fn: Any = None, **opts: Any
) -> None:
    leaves = [a.detach().to(device).requires_grad_() for a in args]
    op = fn or (lambda *a: torch.ops.nki.moe_mlp(*a, **opts))
    out = op(*leaves)
    assert out.device.type == device and out.dtype == dtype
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out.backward(grad.to(device))
    refs = [a.detach().float().requires_grad_() for a in args]
    ref = moe_reference(*refs, **opts)
    ref.backward(grad.float())
    assert_close_scaled(out.cpu(), ref, dtype, "out")
    for name, a, r in zip(("hidden", "router_logits", "w_gate_up", "w_down"), leaves, refs):
        assert a.grad is not None and a.grad.device.type == device and a.grad.dtype == a.dtype
        assert_close_scaled(a.grad.cpu(), r.grad, dtype, f"d {name}")


@pytest.mark.parametrize(
    ("t", "e", "k", "dtype", "opts"),
    [
        (37, 8, 2, F32, {}),
        (1, 8, 2, BF16, {}),
        (130, 8, 1, BF16, {"scoring": "sigmoid", "renormalize": False}),
        (60, 64, 6, F32, {"scoring": "sigmoid"}),
        (90, 8, 8, F32, {"renormalize": False}),
        (200, 8, 2, F32, {"capacity_factor": 0.6}),
    ],
)
def test_moe_mlp_eager_matches_reference(
    t: int, e: int, k: int, dtype: torch.dtype, opts: dict[str, Any]
) -> None:
    _check_fwd_bwd(_inputs(t, 72, 96, e, dtype, seed=t + k), dtype, top_k=k, **opts)


def test_skewed_routing_and_experts_without_tokens() -> None:
    # expert 2 dominates every token's first choice; experts 4..7 are never in the top 2
    bias = torch.tensor([0.0, 0.0, 9.0, 0.0, -30.0, -30.0, -30.0, -30.0])
    args = _inputs(150, 64, 96, 8, F32, seed=11, bias=bias)
    _, ids = torch.ops.nki.moe_route(args[1], top_k=2)
    assert (ids[:, 0] == 2).all() and (ids < 4).all()
    leaves = [a.detach().requires_grad_() for a in args]
    torch.ops.nki.moe_mlp(*leaves, top_k=2).sum().backward()
    assert (leaves[2].grad[4:] == 0).all() and (leaves[3].grad[4:] == 0).all()
    _check_fwd_bwd(args, F32, top_k=2)


def test_the_op_at_lnc2_gives_the_lnc1_results_bit_for_bit() -> None:
    """The custom op launched at LNC 2 (forward: programs split the blocks; backward: the
    blocks of phase A, then the hidden columns of the weight gradients), with capacity
    drops and skewed routing: outputs and gradients equal the LNC 1 launch's exactly."""
    from nki_kernels.runtime import lnc as runtime_lnc

    bias = torch.tensor([6.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    args = _inputs(150, 72, 96, 8, BF16, seed=3, bias=bias)
    results = []
    for lnc in (1, 2):
        runtime_lnc.set_runtime_lnc(lnc)
        try:
            leaves = [a.detach().requires_grad_() for a in args]
            out = torch.ops.nki.moe_mlp(*leaves, top_k=2, capacity_factor=0.9)
            out.float().square().sum().backward()
            results.append([out.detach(), *(a.grad for a in leaves)])
        finally:
            runtime_lnc.set_runtime_lnc(None)
    for name, a, b in zip(("out", "hidden", "logits", "w_gate_up", "w_down"), *results):
        assert a is not None and b is not None and torch.equal(a, b), name


def test_moe_route_op_and_its_gradient() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(50, 16, generator=g, requires_grad=True)
    w, ids = torch.ops.nki.moe_route(logits, top_k=4, scoring="sigmoid")
    lr = logits.detach().clone().requires_grad_()
    w_ref, ids_ref = route_reference(lr, 4, "sigmoid", True)
    assert torch.equal(ids.long(), ids_ref)
    torch.testing.assert_close(w, w_ref.detach(), atol=1e-6, rtol=1e-6)
    dw = torch.randn(50, 4, generator=g)
    (w * dw).sum().backward()
    (w_ref * dw).sum().backward()
    torch.testing.assert_close(logits.grad, lr.grad, atol=1e-6, rtol=1e-5)


def test_emulated_neuron_device(neuron: str) -> None:
    _check_fwd_bwd(_inputs(37, 64, 96, 8, BF16, seed=4), BF16, device=neuron, top_k=2)


def _layer_fn(
    h: torch.Tensor, lg: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor
) -> torch.Tensor:
    return torch.ops.nki.moe_mlp(h, lg, wgu, wd, top_k=2)


def _expert_launches(seen: list[Any]) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {"fwd": [], "bwd": []}
    for r in seen:
        if r.spec.key.kernel.endswith("moe_mlp_fwd"):
            out["fwd"].append(r.args)
        elif r.spec.key.kernel.endswith("moe_mlp_bwd"):
            out["bwd"].append(r.args)
    return out


def test_training_calls_save_gate_up_and_inference_calls_do_not() -> None:
    """A call autograd records runs the forward kernel that saves gate / up and a backward
    that reads them (no recompute), with the recomputing backward's gradients (fp32:
    identical, the same sums in the same order); no_grad calls, and calls with no input
    requiring grad, launch the forward without a save."""
    from nki_kernels.moe.reference import MoERouting
    from nki_kernels.runtime.launch import record_launches

    args = _inputs(150, 64, 96, 8, F32, seed=21)
    leaves = [a.detach().requires_grad_() for a in args]
    grad = torch.randn(150, 64, generator=torch.Generator().manual_seed(2))
    with record_launches() as seen:
        out = torch.ops.nki.moe_mlp(*leaves, top_k=2)
        out.backward(grad)
    runs = _expert_launches(seen)
    assert len(runs["fwd"]) == 1 and runs["fwd"][0][8] is not None  # save_cols
    gate_up = runs["bwd"][0][12]
    assert len(runs["bwd"]) == 1 and gate_up is not None and gate_up.shape[0] == 2 * 96
    opts = MoERouting(2).kwargs()
    recomputed = torch.ops.nki.moe_mlp_backward(grad, *args, **opts)
    for name, a, r in zip(("hidden", "logits", "w_gate_up", "w_down"), leaves, recomputed):
        assert torch.equal(a.grad, r), name
    for ctx, xs in ((torch.no_grad(), leaves), (torch.enable_grad(), args)):
        with ctx, record_launches() as seen:
            plain = torch.ops.nki.moe_mlp(*xs, top_k=2)
        runs = _expert_launches(seen)
        assert len(runs["fwd"]) == 1 and runs["fwd"][0][8] is None and not runs["bwd"]
        assert torch.equal(plain, out.detach())


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_torch_compile_fullgraph(device: str, request: pytest.FixtureRequest) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    compiled = torch.compile(_layer_fn, backend="aot_eager", fullgraph=True)
    _check_fwd_bwd(_inputs(45, 64, 96, 8, F32, seed=6), F32, device=device, fn=compiled, top_k=2)


def test_token_counts_in_one_bucket_share_one_specialization() -> None:
    h, i, e = 40, 72, 4  # unique shape: no other test compiles it
    before = KERNEL_CACHE.compiles_for(moe_mlp_fwd)
    for t in (130, 170, 256):
        x, lg, wgu, wd = _inputs(t, h, i, e, F32, seed=t)
        out = torch.ops.nki.moe_mlp(x, lg, wgu, wd, top_k=2)
        assert_close_scaled(out, moe_reference(x, lg, wgu, wd, 2), F32, f"T={t}")
    assert KERNEL_CACHE.compiles_for(moe_mlp_fwd) == before + 1


def _bad(**over: Any) -> dict[str, Any]:
    x, lg, wgu, wd = _inputs(6, 16, 24, 4, F32, seed=0)
    call = {"hidden": x, "router_logits": lg, "w_gate_up": wgu, "w_down": wd, "top_k": 2}
    call.update(over)
    return call


def _call(c: dict[str, Any]) -> Any:
    c = dict(c)
    pos = [c.pop(n) for n in ("hidden", "router_logits", "w_gate_up", "w_down")]
    return torch.ops.nki.moe_mlp(*pos, **c)


NEGATIVE = [
    ({"top_k": 5}, ValueError, r"top_k: expected 1\.\.4 \(<= E = 4 and <= 8\); got 5"),
    ({"top_k": 0}, ValueError, "top_k: expected 1..4"),
    ({"hidden": torch.randn(6, 17)}, ValueError, r"w_gate_up: expected \[E=4, H=17, 2I\]"),
    ({"router_logits": torch.randn(7, 4)}, ValueError, r"router_logits: expected 6 rows .* got 7"),
    (
        {"w_down": torch.randn(4, 24, 15)},
        ValueError,
        r"w_down: expected \[E, I, H\] = \(4, 24, 16\)",
    ),
    ({"w_gate_up": torch.randn(3, 16, 48)}, ValueError, r"w_gate_up: expected \[E=4, H=16, 2I\]"),
    (
        {"hidden": torch.ones(6, 16, dtype=torch.int32)},
        TypeError,
        "hidden: expected dtype float32, bfloat16; got int32",
    ),
    (
        {"router_logits": torch.ones(6, 4, dtype=torch.int64)},
        TypeError,
        "router_logits: expected dtype float32, bfloat16, float16; got int64",
    ),
    (
        {"w_down": torch.randn(4, 24, 16).bfloat16()},
        TypeError,
        r"w_down: expected dtype torch.float32 \(as hidden\); got torch.bfloat16",
    ),
    (
        {"router_logits": torch.randn(6, 1)},
        ValueError,
        r"router_logits: expected E \(dim 1\) in 2\.\.128; got 1",
    ),
    (
        {"scoring": "relu"},
        ValueError,
        r"scoring: expected one of \('softmax', 'sigmoid'\); got 'relu'",
    ),
    ({"capacity_factor": 0.0}, ValueError, "capacity_factor: expected a number > 0; got 0.0"),
    ({"hidden": torch.randn(6)}, ValueError, "hidden: expected at least 2 dim"),
]


@pytest.mark.parametrize(("over", "exc", "msg"), NEGATIVE)
def test_bad_input_names_the_argument(over: dict[str, Any], exc: type, msg: str) -> None:
    with pytest.raises(exc, match=msg):
        _call(_bad(**over))


def test_wrong_device_names_the_argument(neuron: str) -> None:
    c = _bad()
    c["w_down"] = c["w_down"].to(neuron)
    with pytest.raises(
        ValueError, match=r"w_down: expected device cpu \(as hidden\); got neuron:0"
    ):
        _call(c)


def test_bad_input_fails_the_same_under_compile() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(_layer_fn, backend="aot_eager", fullgraph=True)
    x, lg, wgu, wd = _inputs(6, 16, 24, 4, F32, seed=0)
    with pytest.raises(Exception, match=r"router_logits: expected 6 rows"):
        compiled(x, lg[:5], wgu, wd)
