"""Options the schema would coerce are checked as passed (issue 15, case 7).

Every non-tensor int / float / bool option is a `Scalar` in the schema, so `True` does not
become 1 (or 2 become True) before the validators run; extreme values get named errors.
Eagerly and under torch.compile (the fake runs the same validators).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)
from nki_kernels.ops.registry import registered_ops, strict_schema


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "q": torch.randn(1, 1, 8, 16, generator=g),
        "lg": torch.randn(6, 4, generator=g),
        "x": torch.randn(6, 16, generator=g),
        "wg": torch.randn(4, 16, 8, generator=g),
        "wd": torch.randn(4, 4, 16, generator=g),
        "ids": torch.tensor([[0, 1]] * 6, dtype=torch.int32),
        "gw": torch.randn(6, 2, generator=g),
    }


T = _inputs()
A = torch.ops.nki
# (label, call, exception type, message pattern)
BAD: list[tuple[str, Callable[[], Any], type, str]] = [
    (
        "sliding_window=True",
        lambda: A.flash_attention(T["q"], T["q"], T["q"], sliding_window=True),
        TypeError,
        r"sliding_window: expected an int; got bool",
    ),
    (
        "sliding_window=2.0",
        lambda: A.flash_attention(T["q"], T["q"], T["q"], sliding_window=2.0),
        TypeError,
        r"sliding_window: expected an int; got float",
    ),
    (
        "causal=1",
        lambda: A.flash_attention(T["q"], T["q"], T["q"], causal=1),
        TypeError,
        r"causal: expected a bool; got int",
    ),
    (
        "return_lse=1",
        lambda: A.flash_attention(T["q"], T["q"], T["q"], return_lse=1),
        TypeError,
        r"return_lse: expected a bool; got int",
    ),
    (
        "softmax_scale=True",
        lambda: A.flash_attention(T["q"], T["q"], T["q"], softmax_scale=True),
        TypeError,
        r"softmax_scale: expected a number; got bool",
    ),
    (
        "segment_ids int64 extremes are fine; a bad layout is named",
        lambda: A.flash_attention(
            T["q"], T["q"], T["q"], segment_ids=torch.tensor([[-(2**63), 2**63 - 1] * 4])
        ),
        ValueError,
        r"segment_ids",
    ),
    (
        "eps=True",
        lambda: A.rms_norm(T["x"], None, True),
        TypeError,
        r"eps: expected a float; got bool",
    ),
    (
        "layer_norm eps=True",
        lambda: A.layer_norm(T["x"], None, None, True),
        TypeError,
        r"eps: .*bool",
    ),
    (
        "top_k=True",
        lambda: A.moe_route(T["lg"], top_k=True),
        TypeError,
        r"top_k: expected an int; got bool",
    ),
    (
        "top_k=2.0",
        lambda: A.moe_route(T["lg"], top_k=2.0),
        TypeError,
        r"top_k: expected an int; got float",
    ),
    (
        "renormalize=1",
        lambda: A.moe_route(T["lg"], top_k=2, renormalize=1),
        TypeError,
        r"renormalize: expected a bool; got int",
    ),
    (
        "moe_mlp top_k=True",
        lambda: A.moe_mlp(T["x"], T["lg"], T["wg"], T["wd"], top_k=True),
        TypeError,
        r"top_k: expected an int; got bool",
    ),
    (
        "capacity_factor=inf",
        lambda: A.moe_mlp(T["x"], T["lg"], T["wg"], T["wd"], top_k=2, capacity_factor=float("inf")),
        ValueError,
        r"capacity_factor: expected a finite number > 0 .*; got inf",
    ),
    (
        "capacity_factor=True",
        lambda: A.moe_mlp(T["x"], T["lg"], T["wg"], T["wd"], top_k=2, capacity_factor=True),
        TypeError,
        r"capacity_factor: expected a number; got bool",
    ),
    (
        "route_backward ids out of range",
        lambda: A.moe_route_backward(T["lg"], T["ids"] + 3, T["gw"]),
        ValueError,
        r"ids: expected expert ids in \[0, 4\); got min 3, max 4",
    ),
    (
        "route_backward grad_weights shape",
        lambda: A.moe_route_backward(T["lg"], T["ids"], T["gw"][:, :1]),
        ValueError,
        r"grad_weights: expected shape \(6, 2\) \(as ids\); got \(6, 1\)",
    ),
    (
        "route_backward ids rows",
        lambda: A.moe_route_backward(T["lg"], T["ids"][:5], T["gw"][:5]),
        ValueError,
        r"ids: expected 6 rows",
    ),
    (
        "route_backward ids dtype",
        lambda: A.moe_route_backward(T["lg"], T["ids"].float(), T["gw"]),
        TypeError,
        r"ids: expected dtype int32, int64; got float32",
    ),
    (
        "route_backward renormalize=1",
        lambda: A.moe_route_backward(T["lg"], T["ids"], T["gw"], renormalize=1),
        TypeError,
        r"renormalize: expected a bool; got int",
    ),
]


@pytest.mark.parametrize(("label", "call", "exc", "pattern"), BAD, ids=[b[0] for b in BAD])
def test_bad_option_is_named(label: str, call: Callable[[], Any], exc: type, pattern: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(exc, match=pattern):
            call()


# data checks (ids values, segment layout) run in the kernel path, not the fake
COMPILED = [b for b in BAD if not b[0].startswith(("route_backward ids out", "segment_ids"))]


@pytest.mark.parametrize(
    ("label", "call", "exc", "pattern"), COMPILED[::3], ids=[b[0] for b in COMPILED[::3]]
)
def test_bad_option_is_named_under_compile(
    label: str, call: Callable[[], Any], exc: type, pattern: str
) -> None:
    torch._dynamo.reset()
    fn = torch.compile(call, backend="aot_eager", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as info:
            fn()
    err: BaseException | None = info.value
    while err is not None and not isinstance(err, exc):
        err = err.__cause__ or err.__context__
    assert err is not None, f"{label}: {type(info.value).__name__}: {info.value}"
    assert __import__("re").search(pattern, str(err)), str(err)


def test_extreme_segment_ids_run() -> None:
    q = T["q"]
    seg = torch.tensor([[-(2**63)] * 3 + [2**63 - 1] * 5])
    out = A.flash_attention(q, q, q, segment_ids=seg)[0]
    allowed = seg[0][:, None] == seg[0][None, :]
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=allowed)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=0.0)


def test_every_numeric_option_is_a_scalar() -> None:
    for name, op in registered_ops().items():
        schema = str(op.op.default._schema)
        args = schema.split(") ->")[0]
        for bad in (" SymInt ", " int ", " float ", " bool ", " SymInt? ", " float? ", " bool? "):
            assert bad not in args.replace("(", " ").replace(",", " "), f"{name}: {schema}"
        assert strict_schema(schema) == schema
