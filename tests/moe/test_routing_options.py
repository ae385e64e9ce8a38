"""moe.routing.route (the NKI router, `torch.ops.nki.moe_route_options`) and its torch
specification `route_reference`, option by option: forward and backward against a
float64 per-token loop written from the option definitions (no torch.topk), with tied
logits, NaN / Inf in a token (it stays in its row), 512 experts and k = 16; eager and
under torch.compile(fullgraph=True); CPU and the emulated neuron device; from threads."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from nki_kernels.moe.routing import route, route_reference

ROUTES = {"nki": route, "torch": route_reference}

OPTIONS: dict[str, dict[str, Any]] = {
    "softmax-renorm": dict(top_k=3),
    "softmax-scaled": dict(top_k=3, renormalize=False, scaling=1.5),
    "softmax-bias": dict(top_k=3, bias=True),
    "softmax-groups": dict(top_k=3, n_group=4, topk_group=3, renormalize=False),
    "sigmoid-renorm-scaled": dict(top_k=4, scoring="sigmoid", scaling=2.5),
    "sigmoid-bias": dict(top_k=4, scoring="sigmoid", bias=True, renormalize=False),
    "sigmoid-groups-bias": dict(
        top_k=4, scoring="sigmoid", bias=True, n_group=4, topk_group=2, scaling=2.5
    ),
    "after-topk": dict(top_k=4, softmax_after_topk=True, renormalize=False),
    "after-topk-bias-scaled": dict(
        top_k=2, softmax_after_topk=True, bias=True, renormalize=False, scaling=2.0
    ),
}


FLT_MAX = torch.finfo(torch.float32).max  # a NaN key's rank in a group score


def _order(vals: list[float], eligible: list[int], k: int) -> list[int]:
    """k best of `eligible` by value, ties to the lower index, NaN only to fill k."""
    nan = [e for e in eligible if math.isnan(vals[e])]
    finite = [e for e in eligible if not math.isnan(vals[e])]
    return (sorted(finite, key=lambda e: (-vals[e], e)) + nan)[:k]


def reference(lg: torch.Tensor, bias: torch.Tensor | None, o: dict[str, Any]) -> tuple[Any, Any]:
    """(weights [T, k] float64 with autograd to lg, ids [T, k]) by a loop over tokens."""
    k, e = o["top_k"], lg.shape[1]
    b = [0.0] * e if bias is None else bias.double().tolist()
    rows_w, rows_i = [], []
    for t in range(lg.shape[0]):
        x = lg[t].double()
        if o.get("softmax_after_topk"):
            vals = [float(v) + b[j] for j, v in enumerate(x.tolist())]
            ids = _order(vals, list(range(e)), k)
            w = torch.softmax(x[ids], 0)
        else:
            s = torch.softmax(x, 0) if o.get("scoring", "softmax") == "softmax" else x.sigmoid()
            vals = [float(v) + b[j] for j, v in enumerate(s.tolist())]
            eligible = list(range(e))
            if o.get("n_group"):
                n, size = o["n_group"], e // o["n_group"]
                score = []
                for g in range(n):
                    group = [vals[j] for j in range(g * size, (g + 1) * size)]
                    best = sorted((-FLT_MAX if math.isnan(v) else v for v in group), reverse=True)
                    score.append(sum(best[:2]))
                keep = _order(score, list(range(n)), o["topk_group"])
                eligible = [j for j in range(e) if j // size in keep]
            ids = _order(vals, eligible, k)
            w = s[ids]
            if o.get("renormalize", True):
                w = w / (w.sum() + 1e-20)
        rows_w.append(w * o.get("scaling", 1.0))
        rows_i.append(ids)
    return torch.stack(rows_w), torch.tensor(rows_i)


def _inputs(name: str, t: int = 13, e: int = 16, ties: bool = False) -> tuple[Any, Any, Any]:
    o = dict(OPTIONS[name])
    g = torch.Generator().manual_seed(len(name))
    lg = torch.randn(t, e, generator=g)
    if ties:  # few distinct values: many equal logits per row
        lg = torch.randint(-2, 3, (t, e), generator=g).float() / 2
    bias = torch.randn(e, generator=g) * 0.3 if o.pop("bias", False) else None
    return lg, bias, o


def _compare(lg: Any, bias: Any, o: dict[str, Any], fn: Any = route, rows: Any = None) -> None:
    rows = list(range(lg.shape[0])) if rows is None else rows
    lf = lg.clone().requires_grad_()
    w, ids = fn(lf, bias=bias, **o)
    lr = lg.detach().cpu().double().requires_grad_()
    wr, idr = reference(lr, None if bias is None else bias.cpu(), o)
    assert torch.equal(ids.cpu()[rows], idr[rows])
    torch.testing.assert_close(
        w.detach().cpu().double()[rows], wr.detach()[rows], atol=1e-6, rtol=1e-6
    )
    gw = torch.randn(w.shape, generator=torch.Generator().manual_seed(3))
    (w * gw.to(w.device)).sum().backward()
    (wr[rows] * gw.double()[rows]).sum().backward()
    assert lf.grad is not None and lr.grad is not None
    grad = lf.grad.cpu().double()[rows]
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad, lr.grad[rows], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("impl", sorted(ROUTES))
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_forward_and_backward_per_option(name: str, ties: bool, impl: str) -> None:
    _compare(*_inputs(name, ties=ties), fn=ROUTES[impl])


@pytest.mark.parametrize("impl", sorted(ROUTES))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(
    "name", ["softmax-bias", "sigmoid-bias", "sigmoid-groups-bias", "after-topk"]
)
def test_nan_or_inf_in_a_token_stays_in_its_row(name: str, bad: float, impl: str) -> None:
    lg, bias, o = _inputs(name)
    lg[4, 2] = bad
    _compare(lg, bias, o, fn=ROUTES[impl], rows=[r for r in range(lg.shape[0]) if r != 4])
    w, ids = ROUTES[impl](lg, bias=bias, **o)
    assert int(ids.min()) >= 0 and int(ids.max()) < lg.shape[1]  # a valid expert still
    wr, idr = reference(lg.double(), bias, o)  # the bad row itself: choice and weights
    assert torch.equal(ids[4], idr[4])
    torch.testing.assert_close(w[4].double(), wr[4], atol=1e-6, rtol=1e-6, equal_nan=True)


NAN = float("nan")
NAN_GROUP_ROWS = [
    # a group ranked on its two best keys, the NaN below them: groups 0 and 2 kept
    [NAN, 3, 3, -5] + [0] * 4 + [1] * 4 + [-1] * 4,
    # two NaN keys sum to -inf, one NaN and a score to -FLT_MAX: group 1 beats group 0
    [NAN, NAN, NAN, 1] + [NAN] * 12,
    # NaN experts picked to fill k, never an expert of a dropped group (by index first)
    [NAN] * 4 + [5, 5, NAN, NAN] + [5, NAN, NAN, NAN] + [NAN] * 4,
]


@pytest.mark.parametrize("impl", sorted(ROUTES))
@pytest.mark.parametrize("size", [2, 4])
def test_nan_keys_in_group_scores(size: int, impl: str) -> None:
    lg = torch.tensor(NAN_GROUP_ROWS)
    o = dict(top_k=4, scoring="sigmoid", n_group=16 // size, topk_group=8 // size)
    w, ids = ROUTES[impl](lg, **o)
    wr, idr = reference(lg.double(), None, o)
    assert torch.equal(ids, idr)
    torch.testing.assert_close(w.double(), wr, atol=1e-6, rtol=1e-6, equal_nan=True)
    if size == 4:  # the reviewer's row: groups 0 and 2, not (as a NaN-first sort gave) 1 and 2
        assert ids[0].tolist() == [1, 2, 8, 9]
        assert ids[2].tolist() == [4, 5, 8, 6]


@pytest.mark.parametrize("impl", sorted(ROUTES))
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_512_experts_top_16_with_groups(ties: bool, impl: str) -> None:
    lg, bias, o = _inputs("sigmoid-groups-bias", t=3, e=512, ties=ties)
    _compare(lg, bias, {**o, "top_k": 16, "n_group": 8, "topk_group": 4}, fn=ROUTES[impl])


@pytest.mark.parametrize(
    ("name", "e", "k", "groups"),
    [
        ("softmax-renorm", 5, 3, None),  # E < 8: the max8 source padded with -inf
        ("after-topk", 12, 11, None),  # k > 8 with E < 16: two rounds, few left for the 2nd
        ("sigmoid-groups-bias", 8, 3, (8, 3)),  # groups of one expert (a group's top-1)
        ("softmax-groups", 64, 16, (4, 1)),  # all 16 from one group of 16
    ],
)
def test_edge_widths_and_groups(name: str, e: int, k: int, groups: Any) -> None:
    lg, bias, o = _inputs(name, e=e, ties=True)
    o = {**o, "top_k": k}
    if groups is not None:
        o.update(n_group=groups[0], topk_group=groups[1])
    _compare(lg, bias, o)


@pytest.mark.parametrize(
    "name", ["softmax-groups", "sigmoid-groups-bias", "after-topk-bias-scaled"]
)
def test_torch_compile_fullgraph(name: str) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(route, backend="aot_eager", fullgraph=True)
    _compare(*_inputs(name, ties=True), fn=compiled)


@pytest.mark.parametrize("name", ["sigmoid-groups-bias", "after-topk-bias-scaled"])
def test_torch_compile_fullgraph_on_the_emulated_device(name: str, neuron: str) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(route, backend="aot_eager", fullgraph=True)
    lg, bias, o = _inputs(name, ties=True)
    dev_bias = None if bias is None else bias.to(neuron)
    _compare(lg.to(neuron), dev_bias, o, fn=lambda x, bias, **kw: compiled(x, bias=bias, **kw))


@pytest.mark.parametrize("name", ["sigmoid-groups-bias", "after-topk-bias-scaled"])
def test_emulated_neuron_device(name: str, neuron: str) -> None:
    lg, bias, o = _inputs(name, ties=True)
    dev_bias = None if bias is None else bias.to(neuron)
    _compare(lg.to(neuron), dev_bias, o, fn=lambda x, bias, **kw: route(x, bias=bias, **kw))


# d logits stored in the logits' dtype: one rounding (bf16 u = 2^-8, fp16 2^-11), against
# max |reference|; fp32: a few ulp over k + E terms
DL_TOL = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


@pytest.mark.parametrize("lnc", [1, 2])  # LNC 2: the cores take alternate token tiles
@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("sigmoid-groups-bias", torch.bfloat16),
        ("after-topk-bias-scaled", torch.float16),
        ("softmax-renorm", torch.float32),
    ],
)
def test_kernel_lnc_and_logit_dtypes(name: str, dtype: torch.dtype, lnc: int) -> None:
    from nki_kernels.moe.router_options import moe_route_options_bwd, moe_route_options_fwd

    lg, bias, o = _inputs(name, t=261, e=32)  # 3 token tiles, the last one ragged
    o = {**o, **({"n_group": 8, "topk_group": 3} if "groups" in name else {})}
    lg = lg.to(dtype)
    opts = (o.get("scoring", "softmax"), o.get("softmax_after_topk", False))
    renorm, scale = o.get("renormalize", True), float(o.get("scaling", 1.0))
    w, ids = moe_route_options_fwd[lnc](
        lg, bias, o["top_k"], *opts, o.get("n_group", 0), o.get("topk_group", 0), renorm, scale
    )
    lr = lg.double().requires_grad_()
    wr, idr = reference(lr, bias, o)
    assert ids.dtype == torch.int32 and torch.equal(ids.long(), idr)
    torch.testing.assert_close(w.double(), wr.detach(), atol=1e-6, rtol=1e-6)
    dw = torch.randn(w.shape, generator=torch.Generator().manual_seed(5))
    wr.backward(dw.double())
    dl = moe_route_options_bwd[lnc](lg, ids, dw, *opts, renorm, scale)
    assert dl.dtype == dtype
    err = (dl.double() - lr.grad).abs().max() / lr.grad.abs().max()
    assert err <= DL_TOL[dtype], f"d_logits error {err:.3g}"


def test_threads_give_the_serial_result(neuron: str) -> None:
    import threading

    calls = [(n, dev, seed) for seed, n in enumerate(sorted(OPTIONS)) for dev in ("cpu", neuron)]

    def one(call: tuple[str, str, int]) -> list[torch.Tensor]:
        name, dev, seed = call
        lg, bias, o = _inputs(name, t=9 + seed)
        lf = lg.to(dev).requires_grad_()
        w, ids = route(lf, bias=None if bias is None else bias.to(dev), **o)
        (g,) = torch.autograd.grad(w.square().sum(), [lf])
        return [w.detach().cpu(), ids.cpu(), g.cpu()]

    want = [one(c) for c in calls]
    got: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(j: int) -> None:
        try:
            start.wait()
            for i in range(j, len(calls), 4):
                got[i] = one(calls[i])
        except BaseException as e:  # re-raised in the test's thread
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(j,)) for j in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]
    for call, a, b in zip(calls, got, want):
        for x, y in zip(a, b):
            assert torch.equal(x, y), f"{call}: differs from the serial run"


@pytest.mark.parametrize("name", ["softmax-renorm", "sigmoid-groups-bias", "after-topk"])
def test_all_tokens_on_the_same_experts(name: str) -> None:
    # every token's logits are one and the same row: the same k experts for all
    lg, bias, o = _inputs(name, t=140)  # two token tiles
    lg = lg[:1].expand(140, -1).clone()
    _compare(lg, bias, o)
    _, ids = route(lg, bias=bias, **o)
    assert bool((ids == ids[:1]).all())
