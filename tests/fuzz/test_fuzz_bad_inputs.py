"""Property: every bad argument of every op raises TypeError / ValueError naming that
argument, eagerly and under torch.compile, on CPU and on the neuron device -- never a
wrong answer, an OverflowError or an error from deep inside the interpreter."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch
from fuzz_support import count_case, devices, modes, run
from hypothesis import given
from hypothesis import strategies as st

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)
from nki_kernels.norm.limits import max_hidden

A = torch.ops.nki


def _good(device: str) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    return {
        "q": r(1, 2, 9, 16), "k": r(1, 1, 7, 16), "v": r(1, 1, 7, 16),
        "x": r(5, 24), "w": r(24), "b": r(24), "res": r(5, 24),
        "lg": r(5, 4), "wgu": r(4, 24, 16), "wd": r(4, 8, 24),
    }  # fmt: skip


# op -> (call with keyword overrides, the good keyword arguments)
def _attention(t: dict[str, Any], **kw: Any) -> Any:
    return A.flash_attention(kw.pop("q", t["q"]), kw.pop("k", t["k"]), kw.pop("v", t["v"]), **kw)


def _rms(t: dict[str, Any], **kw: Any) -> Any:
    return A.rms_norm(kw.get("x", t["x"]), kw.get("weight", t["w"]), kw.get("eps", 1e-6))


def _ln(t: dict[str, Any], **kw: Any) -> Any:
    return A.layer_norm(
        kw.get("x", t["x"]), kw.get("weight", t["w"]), kw.get("bias", t["b"]), kw.get("eps", 1e-5)
    )


# fp32 layer_norm forward with weight and bias: its largest hidden size on trn2
LN_WB_LIMIT = max_hidden("layer_norm", False, "float32", "wb", "trn2")


def _ln_wide(t: dict[str, Any], **kw: Any) -> Any:
    """layer_norm with weight and bias as wide as x (its hidden-size limit is the error)."""
    x = kw["x"]
    p = torch.ones(x.shape[-1], device=x.device)
    return A.layer_norm(x, p, p, 1e-5)


def _add(t: dict[str, Any], **kw: Any) -> Any:
    return A.add_rms_norm(
        kw.get("x", t["x"]), kw.get("residual", t["res"]), kw.get("weight", t["w"]),
        kw.get("eps", 1e-6),
    )  # fmt: skip


def _route(t: dict[str, Any], **kw: Any) -> Any:
    lg = kw.pop("router_logits", t["lg"])
    return A.moe_route(lg, **{"top_k": 2, **kw})


def _mlp(t: dict[str, Any], **kw: Any) -> Any:
    names = (("hidden", "x"), ("router_logits", "lg"), ("w_gate_up", "wgu"), ("w_down", "wd"))
    args = [kw.pop(n, t[k]) for n, k in names]
    return A.moe_mlp(*args, **{"top_k": 2, **kw})


def _bad_values(t: dict[str, Any]) -> list[tuple[Callable[..., Any], str, Any]]:
    """(op call, argument, bad value): each value is wrong for that argument alone."""
    q, x = t["q"], t["x"]
    return [
        (_attention, "causal", 1), (_attention, "causal", "yes"),
        (_attention, "sliding_window", True), (_attention, "sliding_window", 0),
        (_attention, "sliding_window", 2.0), (_attention, "softmax_scale", True),
        (_attention, "softmax_scale", 0.0), (_attention, "softmax_scale", -1.0),
        (_attention, "softmax_scale", math.inf), (_attention, "softmax_scale", math.nan),
        (_attention, "softmax_scale", 1e-38), (_attention, "return_lse", 1),
        (_attention, "q", q.to(torch.int32)), (_attention, "q", q[..., :0]),
        (_attention, "q", q[0]), (_attention, "k", t["k"].to(torch.float16)),
        (_attention, "k", t["k"][..., :8]), (_attention, "v", t["v"][:, :, :5]),
        (_attention, "q", torch.randn(1, 2, 9, 300, device=q.device)),
        (_attention, "kv_lens", torch.tensor([3, 4], device=q.device)),
        (_attention, "kv_lens", torch.tensor([2.0], device=q.device)),
        (_rms, "eps", True), (_rms, "eps", 0.0), (_rms, "eps", -1e-6), (_rms, "eps", math.inf),
        (_rms, "eps", math.nan), (_rms, "x", x.to(torch.int64)), (_rms, "weight", t["w"][:7]),
        (_rms, "weight", t["w"].double()), (_rms, "x", x[:0]),
        (_ln, "eps", True), (_ln, "bias", t["b"][:3]), (_ln, "weight", t["w"].to(torch.float16)),
        (_ln_wide, "x", torch.randn(2, LN_WB_LIMIT + 1, device=x.device)),
        (_add, "residual", t["res"][:, :3]), (_add, "residual", t["res"].to(torch.bfloat16)),
        (_add, "eps", False),
        (_route, "top_k", True), (_route, "top_k", 0), (_route, "top_k", 5), (_route, "top_k", 2.0),
        (_route, "renormalize", 1), (_route, "scoring", "relu"),
        (_route, "router_logits", t["lg"][:, :1]), (_route, "router_logits", t["lg"][0]),
        (_route, "router_logits", t["lg"].to(torch.int32)),
        (_mlp, "top_k", True), (_mlp, "capacity_factor", math.inf),
        (_mlp, "capacity_factor", True), (_mlp, "capacity_factor", 0.0),
        (_mlp, "capacity_factor", math.nan), (_mlp, "renormalize", 0),
        (_mlp, "hidden", x.to(torch.float16)), (_mlp, "w_down", t["wd"][:, :, :5]),
        (_mlp, "w_gate_up", t["wgu"][:, :, :15]), (_mlp, "router_logits", t["lg"][:4]),
    ]  # fmt: skip


BAD_COUNT = len(_bad_values(_good("cpu")))


def _root_error(e: BaseException) -> BaseException:
    """The TypeError / ValueError (or schema RuntimeError) under torch.compile's wrapping."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, (TypeError, ValueError, RuntimeError)) and not type(
            seen
        ).__module__.startswith("torch._dynamo"):
            return seen
        seen = seen.__cause__ or seen.__context__
    return e


@given(st.integers(0, BAD_COUNT - 1), devices, modes)
def test_bad_argument_is_named(index: int, device: str, mode: str) -> None:
    count_case("bad-input")
    t = _good(device)
    call, arg, value = _bad_values(t)[index]
    try:
        run(lambda: call(t, **{arg: value}), mode)
    except Exception as e:
        root = _root_error(e)
        if isinstance(root, RuntimeError) and f"for argument '{arg}'" in str(root):
            return  # torch's schema parser: a value that is not even a number (e.g. a str)
        assert isinstance(root, (TypeError, ValueError)), f"{arg}={value!r}: {type(e).__name__}"
        msg = str(root).splitlines()[0]
        assert re.match(rf"{arg}: expected ", msg) or (
            arg in ("q", "k", "v") and re.match(r"[qkv]: expected ", msg)
        ), f"{arg}={value!r}: message does not name the argument: {msg}"
        return
    raise AssertionError(f"{arg}={value!r} was accepted")


def test_every_bad_argument_eagerly_on_cpu() -> None:
    """The whole matrix once (the property above samples it, with devices and compile)."""
    t = _good("cpu")
    for call, arg, value in _bad_values(t):
        count_case("bad-input")
        try:
            call(t, **{arg: value})
        except (TypeError, ValueError) as e:
            assert str(e).startswith(f"{arg}: expected ") or (
                arg in ("q", "k", "v") and re.match(r"[qkv]: expected ", str(e))
            ), f"{arg}={value!r}: {e}"
            continue
        except RuntimeError as e:
            assert f"for argument '{arg}'" in str(e), f"{arg}={value!r}: {e}"
            continue
        raise AssertionError(f"{arg}={value!r} was accepted")
