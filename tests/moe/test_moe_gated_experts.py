"""moe_gated_experts: expert biases, GPT-OSS's clamped SwiGLU, GeGLU, shared experts
(ungated and sigmoid-gated) on grouped_mm + the expert_act kernels; forward and every
gradient against a float64 loop, with empty experts, all tokens on one expert, NaN / Inf
in a token, torch.compile(fullgraph=True), on CPU and the emulated neuron device."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nki_kernels.moe.gated_reference import gated_experts_reference
from nki_kernels.ops.moe_gated_experts import moe_gated_experts

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
# relative to the largest magnitude; 16-bit: ~5 roundings deep
TOL = {F32: 3e-5, BF16: 2.0**-5, F16: 2.0**-8}

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
TENSORS = ("hidden", "weights", "w_gate_up", "w_down", "b_gate_up", "b_down",
           "shared_gate_up", "shared_down", "shared_gate")  # fmt: skip


def _case(
    t: int = 37, h: int = 24, i: int = 20, e: int = 5, k: int = 2, *, dtype: Any = F32,
    bias: bool = True, shared: str | None = None, scale: float = 1.0, seed: int = 0,
    ids: torch.Tensor | None = None,
) -> dict[str, Any]:  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    c: dict[str, Any] = {
        "hidden": torch.randn(t, h, generator=g) * scale,
        "weights": torch.rand(t, k, generator=g),
        "ids": ids if ids is not None else
        torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]),
        "w_gate_up": torch.randn(e, h, 2 * i, generator=g) / h**0.5,
        "w_down": torch.randn(e, i, h, generator=g) / i**0.5,
    }  # fmt: skip
    if bias:
        c["b_gate_up"] = torch.randn(e, 2 * i, generator=g)
        c["b_down"] = torch.randn(e, h, generator=g)
    if shared:
        c["shared_gate_up"] = torch.randn(h, 2 * 16, generator=g) / h**0.5
        c["shared_down"] = torch.randn(16, h, generator=g) / 4
        if shared == "gated":
            c["shared_gate"] = torch.randn(h, generator=g) / h**0.5
    for name in TENSORS:
        if name in c and name != "weights":
            c[name] = c[name].to(dtype)
    return c


def _run(fn: Any, case: dict[str, Any], dy: torch.Tensor, device: str = "cpu", **opts: Any) -> Any:
    leaves = {
        n: v.detach().clone().to(device).requires_grad_() if n in TENSORS else v.to(device)
        for n, v in case.items()
    }
    out = fn(**leaves, **opts)
    out.backward(dy.to(device).to(out.dtype))
    return out.cpu(), {n: leaves[n].grad.cpu() for n in TENSORS if n in leaves}


def _check(
    case: dict[str, Any], fn: Any = moe_gated_experts, device: str = "cpu", **opts: Any
) -> Any:
    dtype = case["hidden"].dtype
    dy = torch.randn(case["hidden"].shape, generator=torch.Generator().manual_seed(7))
    out, grads = _run(fn, case, dy, device, **opts)
    ref, ref_grads = _run(
        gated_experts_reference,
        {n: v.double() if n in TENSORS else v for n, v in case.items()},
        dy.double(),
        **opts,
    )
    _close(out, ref, dtype, "out")
    for name, g in grads.items():
        _close(g, ref_grads[name], dtype, f"d {name}")
    return out, grads


def _close(a: torch.Tensor, b: torch.Tensor, dtype: Any, what: str) -> None:
    scale = max(1e-3, float(b.detach().abs().max()))
    err = float((a.detach().double() - b.detach()).abs().max()) / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]:.3g}"


@pytest.mark.parametrize(
    ("activation", "interleaved", "bias"),
    [("swiglu", False, True), ("swiglu", True, False), ("geglu", False, True),
     ("gpt_oss", True, True), ("gpt_oss", False, False)],
)  # fmt: skip
def test_every_activation_forward_and_backward(
    activation: str, interleaved: bool, bias: bool
) -> None:
    # scale 3: pre-activations beyond +-7, so GPT-OSS's clamps cut on both sides
    case = _case(bias=bias, scale=3.0 if activation == "gpt_oss" else 1.0)
    _check(case, activation=activation, interleaved=interleaved)


def test_gpt_oss_clamps_are_active() -> None:
    """The case above does reach the clamps (the test would not see a wrong clamp else)."""
    c = _case(scale=3.0)
    z = torch.einsum("th,thn->tn", c["hidden"], c["w_gate_up"][c["ids"][:, 0]])
    z = z + c["b_gate_up"][c["ids"][:, 0]]
    assert (z[:, 0::2] > 7).any() and (z[:, 1::2] > 7).any() and (z[:, 1::2] < -7).any()


@pytest.mark.parametrize("shared", ["ungated", "gated"])
def test_shared_expert(shared: str) -> None:
    _check(_case(t=21, bias=False, shared=shared), activation="swiglu")


def test_empty_experts_and_all_tokens_on_one_expert() -> None:
    t, e = 29, 6
    ids = torch.stack([torch.zeros(t, dtype=torch.int64), torch.full((t,), 3)], 1)
    _, grads = _check(_case(t=t, e=e, ids=ids), activation="gpt_oss", interleaved=True)
    for unused in (1, 2, 4, 5):  # empty experts: zero gradients, exactly
        for name in ("w_gate_up", "w_down", "b_gate_up", "b_down"):
            assert not grads[name][unused].any(), (name, unused)
    one = torch.zeros(t, 1, dtype=torch.int64)  # every token on expert 0, k = 1
    _check(_case(t=t, e=e, k=1, ids=one), activation="geglu")


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_16_bit(dtype: Any) -> None:
    _check(_case(t=19, dtype=dtype, shared="gated"), activation="gpt_oss", interleaved=True)


def test_shared_expert_fused_as_one_more_routed_expert() -> None:
    """The one-launch form: the shared expert stacked as expert E (weights stacked once,
    at load) and one more routing column (id E, weight sigmoid(x . g)) gives the same
    layer as the separate shared launches."""
    c = _case(t=21, bias=False, shared="gated", i=16)
    sep = moe_gated_experts(**c)
    t = c["hidden"].shape[0]
    gate = torch.sigmoid(c["hidden"] @ c.pop("shared_gate"))
    w_gu = torch.cat([c["w_gate_up"], c.pop("shared_gate_up")[None]])
    w_d = torch.cat([c["w_down"], c.pop("shared_down")[None]])
    ids = torch.cat([c["ids"], torch.full((t, 1), w_gu.shape[0] - 1)], 1)
    weights = torch.cat([c["weights"], gate[:, None]], 1)
    fused = moe_gated_experts(c["hidden"], weights, ids, w_gu, w_d)
    torch.testing.assert_close(fused, sep, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_in_a_token_stays_in_its_row(bad: float) -> None:
    c = _case(t=23, e=6, k=2, shared="gated")
    c["hidden"][5, 3] = bad
    dy = torch.randn(23, 24, generator=torch.Generator().manual_seed(1))
    out, grads = _run(moe_gated_experts, c, dy, activation="gpt_oss", interleaved=True)
    clean = [r for r in range(23) if r != 5]
    ref = gated_experts_reference(**{n: v.double() if n in TENSORS else v for n, v in c.items()},
                                  activation="gpt_oss", interleaved=True)  # fmt: skip
    assert not torch.isfinite(out[5]).all()
    _close(out[clean], ref[clean], F32, "clean rows")
    assert (
        torch.isfinite(grads["hidden"][clean]).all()
        and torch.isfinite(grads["weights"][clean]).all()
    )
    hit = set(c["ids"][5].tolist())
    for name in ("w_gate_up", "w_down", "b_gate_up", "b_down"):
        for ex in range(6):
            finite = bool(torch.isfinite(grads[name][ex]).all())
            assert finite or ex in hit, f"d {name}[{ex}] non-finite, not an expert of token 5"


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_id_e_is_not_on_this_rank(device: str, request: pytest.FixtureRequest) -> None:
    # transformers' expert parallelism masks other ranks' slots as local id E, weight 0;
    # here their weights are NaN / Inf: a select keeps them out of every output and grad
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    c = _case(t=19, e=5, k=3, shared="ungated")
    g = torch.Generator().manual_seed(4)
    off = torch.rand(19, 3, generator=g) < 0.4
    off[7] = True  # a token with no expert on this rank: the shared expert alone
    c["ids"] = torch.where(off, 5, c["ids"])
    c["weights"] = torch.where(off, torch.tensor(float("nan")), c["weights"])
    c["weights"][off.nonzero()[::2].unbind(1)] = float("inf")
    out, grads = _check(c, device=device, activation="gpt_oss", interleaved=True)
    assert torch.isfinite(out).all()
    assert bool((grads["weights"][off] == 0).all()), "a masked slot's weight got a gradient"


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_torch_compile_fullgraph(device: str, request: pytest.FixtureRequest) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    compiled = torch.compile(moe_gated_experts, backend="aot_eager", fullgraph=True)
    _check(_case(t=17, shared="gated"), fn=compiled, device=device, activation="gpt_oss",
           interleaved=True)  # fmt: skip


def test_emulated_neuron_device_eager(neuron: str) -> None:
    _check(_case(t=15, shared="ungated"), device=neuron, activation="geglu")


@pytest.mark.parametrize(
    ("change", "match"),
    [({"activation": "relu"}, "activation: expected one of"),
     ({"limit": True}, "limit: expected a finite number"),
     ({"limit": float("inf")}, "limit: expected a finite number"),
     ({"b_gate_up": torch.zeros(5, 7)}, r"b_gate_up: expected \[E, N\] = \(5, 40\); got \(5, 7\)"),
     ({"shared_down": torch.zeros(16, 24)}, "shared_gate_up / shared_down: give both"),
     ({"ids": torch.zeros(37, 2, dtype=torch.int64).fill_(6)},
      r"ids: expected expert ids in \[0, 5\] \(5: not on this rank\); got min 6, max 6")],
)  # fmt: skip
def test_bad_input_is_named(change: dict[str, Any], match: str) -> None:
    c = _case()
    opts = {k: change.pop(k) for k in ("activation", "limit") if k in change}
    c.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        moe_gated_experts(**c, **opts)
