"""moe_gated_experts' inputs and its choice of form: optional tensor arguments (expert
biases, shared expert) given as something other than a tensor are refused with an error
naming the argument; expert parameters requiring a gradient take the grouped composition
when grad mode is on (eagerly and compiled) and the decode launch under no_grad /
inference_mode."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_moe_gated_experts import F32, TENSORS, _case, _close

import nki_kernels.ops.moe_gated_experts as gated_ops
from nki_kernels.moe.gated_reference import gated_experts_reference
from nki_kernels.ops.moe_gated_experts import moe_gated_experts


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(
    ("arg", "value", "received"),
    [("b_gate_up", 0.5, "float"),
     ("b_down", [0.0] * 24, "list"),
     ("shared_gate_up", "w", "str"),
     ("shared_down", 1, "int"),
     ("shared_gate", [1.0] * 24, "list")],
)  # fmt: skip
def test_a_non_tensor_optional_argument_is_named(
    grad: bool, arg: str, value: Any, received: str
) -> None:
    c = _case(t=4, shared="gated")
    c[arg] = value
    c["hidden"].requires_grad_(grad)  # with a gradient: the grouped composition's call
    with pytest.raises(TypeError, match=f"{arg}: expected a tensor; got {received}"):
        moe_gated_experts(**c)


def _launches(monkeypatch: Any) -> list[str]:
    """Records which form each call of moe_gated_experts runs."""
    seen: list[str] = []
    decode, mlp = gated_ops.decode_gated_experts, gated_ops._mlp

    def spy_decode(*a: Any, **k: Any) -> Any:
        seen.append("decode")
        return decode(*a, **k)

    def spy_mlp(*a: Any, **k: Any) -> Any:
        seen.append("composition")
        return mlp(*a, **k)

    monkeypatch.setattr(gated_ops, "decode_gated_experts", spy_decode)
    monkeypatch.setattr(gated_ops, "_mlp", spy_mlp)
    return seen


@pytest.mark.parametrize(
    ("mode", "form"),
    [("grad", "composition"), ("no_grad", "decode"), ("inference_mode", "decode")],
)
def test_expert_parameters_requiring_grad_pick_the_form_by_grad_mode(
    monkeypatch: Any, mode: str, form: str
) -> None:
    # a model's parameters require a gradient, its inputs do not: training (grad mode on)
    # must run the differentiable composition, generate() (no_grad / inference_mode) the
    # decode launch; both give the same layer
    c = _case(t=6, shared="gated")
    params = {n: torch.nn.Parameter(c[n]) for n in ("w_gate_up", "b_down", "shared_gate")}
    seen = _launches(monkeypatch)
    ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad,
           "inference_mode": torch.inference_mode}[mode]  # fmt: skip
    with ctx():
        out = moe_gated_experts(**{**c, **params}, activation="gpt_oss", interleaved=True)
    assert set(seen) == {form}, seen
    if form == "composition":
        out.sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params.values())
    ref = gated_experts_reference(
        **{n: v.double() if n in TENSORS else v for n, v in c.items()},
        activation="gpt_oss", interleaved=True,
    )  # fmt: skip
    _close(out.detach(), ref, F32, mode)


def test_compiled_call_with_a_parameter_requiring_grad_runs_the_composition(
    monkeypatch: Any,
) -> None:
    c = _case(t=6, shared="ungated")
    w_down = torch.nn.Parameter(c.pop("w_down"))
    seen = _launches(monkeypatch)
    torch._dynamo.reset()
    compiled = torch.compile(moe_gated_experts, backend="aot_eager", fullgraph=True)
    compiled(**c, w_down=w_down, activation="geglu").sum().backward()
    assert "decode" not in seen and w_down.grad is not None
    seen.clear()
    with torch.no_grad():
        compiled(**c, w_down=w_down, activation="geglu")
    assert seen == ["decode"], seen
