"""torch.ops.nki.grouped_mm against torch._grouped_mm's contract, on cases beside
test_grouped_mm.py's: torch itself where it runs on CPU (16-byte aligned rows), strided
and transposed views of x and w, expanded gradients, non-finite values in rows and groups
that no output reads, zero rows, the forms of torch._grouped_mm this op refuses (named),
bad offsets under torch.compile, transposed bf16 weights compiled on the emulated device,
and threads with different plans giving the serial result."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from test_grouped_mm import _close, reference  # tests/moe on sys.path

import nki_kernels.ops.grouped_mm  # noqa: F401  (registers the op)

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _offs(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _randn(*shape: int, seed: int, dtype: torch.dtype = F32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) / shape[-1] ** 0.25).to(dtype)


def _fwd_bwd_vs_reference(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> None:
    """x and w may be views: the gradients must come back in their shapes."""
    dtype = x.dtype
    xl, wl = x.detach().requires_grad_(), w.detach().requires_grad_()
    out = torch.ops.nki.grouped_mm(xl, wl, offs)
    dy = _randn(*out.shape, seed=11, dtype=dtype)
    out.backward(dy)
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    ref = reference(xr, wr, offs)
    ref.backward(dy.double())
    assert out.dtype == dtype and out.shape == ref.shape
    assert xl.grad is not None and wl.grad is not None
    assert xl.grad.shape == x.shape and wl.grad.shape == w.shape
    assert xr.grad is not None and wr.grad is not None
    _close(out, ref, dtype, "out")
    _close(xl.grad, xr.grad, dtype, "d x")
    _close(wl.grad, wr.grad, dtype, "d w")


# ---- torch._grouped_mm itself -------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("transposed_w", [False, True], ids=["kn", "nk-view"])
def test_matches_torch_grouped_mm_on_cpu(dtype: torch.dtype, transposed_w: bool) -> None:
    # torch's CPU kernel needs 16-byte aligned rows: K and N multiples of 8
    x = _randn(50, 24, seed=1, dtype=dtype)
    offs = _offs([0, 17, 17, 41])  # empty first and third groups, rows 41.. in none
    w = _randn(4, 24, 40, seed=2, dtype=dtype)
    if transposed_w:  # TorchTitan's w.transpose(-2, -1) of a [G, N, K] parameter
        w = w.transpose(-2, -1).contiguous().transpose(-2, -1)
    ours = torch.ops.nki.grouped_mm(x, w, offs)
    theirs = torch._grouped_mm(x, w, offs=offs)
    assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape
    # torch leaves rows past offs[-1] unwritten (whatever the allocation held): compare
    # the rows in groups; ours are zero there
    _close(ours[:41], reference(x, w, offs)[:41], dtype, "vs float64")
    _close(ours[:41], theirs[:41].double(), dtype, "vs torch._grouped_mm")
    assert torch.equal(ours[41:], torch.zeros(9, 40, dtype=dtype))


# ---- views --------------------------------------------------------------------------------
VIEWS: dict[str, Any] = {
    "x-column-slice": lambda: (_randn(30, 40, seed=3)[:, ::2], _randn(3, 20, 12, seed=4)),
    "x-transposed": lambda: (_randn(20, 30, seed=3).t(), _randn(3, 20, 12, seed=4)),
    "w-column-slice": lambda: (_randn(30, 20, seed=3), _randn(3, 20, 24, seed=4)[:, :, 1::2]),
    "w-group-permuted": lambda: (
        _randn(30, 20, seed=3),
        _randn(20, 3, 12, seed=4).permute(1, 0, 2),
    ),
    "w-expanded": lambda: (_randn(30, 20, seed=3), _randn(1, 20, 12, seed=4).expand(3, 20, 12)),
    "w-nk-bf16": lambda: (
        _randn(30, 20, seed=3, dtype=BF16),
        _randn(3, 12, 20, seed=4, dtype=BF16).transpose(-2, -1),
    ),
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_strided_views_forward_and_backward(view: str) -> None:
    x, w = VIEWS[view]()
    _fwd_bwd_vs_reference(x, w, _offs([4, 4, 27]))


def test_expanded_gradient_of_a_sum() -> None:
    """out.sum().backward() hands the op a stride-0 gradient."""
    x, w, offs = _randn(26, 16, seed=5), _randn(3, 16, 8, seed=6), _offs([9, 9, 20])
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.ops.nki.grouped_mm(xl, wl, offs).sum().backward()
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    reference(xr, wr, offs).sum().backward()
    assert xl.grad is not None and wl.grad is not None
    assert xr.grad is not None and wr.grad is not None
    _close(xl.grad, xr.grad, F32, "d x")
    _close(wl.grad, wr.grad, F32, "d w")


# ---- values no output reads ---------------------------------------------------------------
def test_non_finite_rows_past_the_last_offset_reach_nothing() -> None:
    x, w, offs = _randn(20, 16, seed=7), _randn(2, 16, 8, seed=8), _offs([6, 14])
    x[15], x[19, 3] = float("nan"), float("inf")
    dy = _randn(20, 8, seed=9)
    dy[14], dy[18, 0] = float("inf"), float("nan")
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = torch.ops.nki.grouped_mm(xl, wl, offs)
    out.backward(dy)
    assert torch.equal(out[14:], torch.zeros(6, 8))
    assert xl.grad is not None and wl.grad is not None
    assert torch.equal(xl.grad[14:], torch.zeros(6, 16))
    assert torch.isfinite(out).all() and torch.isfinite(xl.grad).all()
    assert torch.isfinite(wl.grad).all()
    xr, wr = x[:14].double().requires_grad_(), w.double().requires_grad_()
    ref = reference(xr, wr, offs)
    ref.backward(dy[:14].double())
    assert wr.grad is not None
    _close(out[:14], ref, F32, "out")
    _close(wl.grad, wr.grad, F32, "d w")


def test_non_finite_weights_stay_in_their_group() -> None:
    x, w, offs = _randn(24, 16, seed=10), _randn(4, 16, 8, seed=11), _offs([5, 5, 12, 24])
    w[1] = float("nan")  # an empty group: read by no row
    w[2, 3, 4] = float("inf")  # group 2 holds rows 5..11
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = torch.ops.nki.grouped_mm(xl, wl, offs)
    bad_rows = (~torch.isfinite(out)).any(dim=1).nonzero().flatten().tolist()
    assert bad_rows == list(range(5, 12))
    assert bool((~torch.isfinite(out[5:12, 4])).all())
    assert torch.isfinite(out[5:12, :4]).all() and torch.isfinite(out[5:12, 5:]).all()
    out.backward(torch.ones_like(out))
    assert wl.grad is not None and xl.grad is not None
    assert torch.equal(wl.grad[1], torch.zeros(16, 8))  # empty: a zero gradient, not NaN
    bad_dx = (~torch.isfinite(xl.grad)).any(dim=1).nonzero().flatten().tolist()
    assert bad_dx == list(range(5, 12))


# ---- sizes --------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_zero_rows(device: str, request: pytest.FixtureRequest) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    x = torch.zeros(0, 16, device=device, requires_grad=True)
    w = _randn(3, 16, 8, seed=12).to(device).requires_grad_()
    out = torch.ops.nki.grouped_mm(x, w, torch.zeros(3, dtype=torch.int32, device=device))
    assert out.shape == (0, 8) and out.device.type == torch.device(device).type
    assert torch._grouped_mm(x.detach().cpu(), w.detach().cpu(), offs=_offs([0, 0, 0])).shape == (
        0,
        8,
    )
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 16)
    assert w.grad is not None and torch.equal(w.grad.cpu(), torch.zeros(3, 16, 8))


# ---- forms torch._grouped_mm has and this op refuses --------------------------------------
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "offs", "match"),
    [
        # 2-D x 2-D, offs along K: the weight gradient -> grouped_mm_weight_grad
        ((8, 16), (16, 8), [2, 5, 16], r"w: expected 3 dims .*grouped_mm_weight_grad"),
        # 3-D x 2-D, offs along N
        ((3, 8, 16), (16, 8), [2, 5, 8], r"x_sorted: expected 2 dims \[M, K\]"),
        # 3-D x 3-D: batched, no offs in torch
        ((3, 8, 16), (3, 16, 8), [2, 5, 8], r"x_sorted: expected 2 dims .*torch.bmm"),
    ],
)
def test_other_torch_forms_are_refused_by_name(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], offs: list[int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        torch.ops.nki.grouped_mm(torch.randn(x_shape), torch.randn(w_shape), _offs(offs))


@pytest.mark.parametrize(
    ("offs", "match"),
    [([5, 3, 9], "non-decreasing"), ([-1, 3, 9], r"\[0, 12\]"), ([3, 6, 13], r"\[0, 12\]")],
)
def test_bad_offsets_are_named_under_torch_compile(offs: list[int], match: str) -> None:
    """torch's CPU kernel accepts these and returns garbage; here the plan (a host op in
    the graph) names them."""
    torch._dynamo.reset()
    compiled = torch.compile(torch.ops.nki.grouped_mm, backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError, match=f"offs: .*{match}"):
        compiled(torch.randn(12, 8), torch.randn(3, 8, 4), _offs(offs))


def test_compiled_transposed_bf16_weights_on_the_emulated_device(neuron: str) -> None:
    torch._dynamo.reset()
    x = _randn(45, 32, seed=13, dtype=BF16)
    w_nk = _randn(3, 24, 32, seed=14, dtype=BF16)  # [G, N, K] as TorchTitan stores it
    offs = _offs([20, 20, 40])

    def seam(a: torch.Tensor, b_t: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return torch.ops.nki.grouped_mm(a, b_t.transpose(-2, -1), o)

    compiled = torch.compile(seam, backend="aot_eager", fullgraph=True)
    xl = x.to(neuron).requires_grad_()
    wl = w_nk.to(neuron).requires_grad_()
    out = compiled(xl, wl, offs.to(neuron))
    dy = _randn(45, 24, seed=15, dtype=BF16)
    out.backward(dy.to(neuron))
    xr, wr = x.double().requires_grad_(), w_nk.double().requires_grad_()
    ref = reference(xr, wr.transpose(-2, -1), offs)
    ref.backward(dy.double())
    assert out.device.type == "neuron" and out.dtype == BF16
    assert xl.grad is not None and wl.grad is not None and wl.grad.shape == w_nk.shape
    assert xr.grad is not None and wr.grad is not None
    _close(out.cpu(), ref, BF16, "out")
    _close(xl.grad.cpu(), xr.grad, BF16, "d x")
    _close(wl.grad.cpu(), wr.grad, BF16, "d w")


# ---- threads ------------------------------------------------------------------------------
def test_threads_with_different_plans_give_the_serial_result() -> None:
    plans = [[0, 30, 30], [10, 10, 25], [30, 30, 30], [1, 2, 3], [7, 19, 29], [0, 0, 0]]

    def one(i: int) -> list[torch.Tensor]:
        x = _randn(30, 16, seed=20 + i, dtype=BF16 if i % 2 else F32).requires_grad_()
        w = _randn(3, 16, 12, seed=40 + i, dtype=x.dtype).requires_grad_()
        out = torch.ops.nki.grouped_mm(x, w, _offs(plans[i]))
        dx, dw = torch.autograd.grad(out.float().square().sum(), [x, w])
        return [out.detach(), dx, dw]

    want = [one(i) for i in range(len(plans))]
    got: list[Any] = [None] * len(plans)
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def worker(j: int) -> None:
        try:
            start.wait()
            for i in range(j, len(plans), 3):
                got[i] = one(i)
        except BaseException as e:  # re-raised in the test's thread
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(j,)) for j in range(3)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]
    for i, (a, b) in enumerate(zip(got, want)):
        for u, v in zip(a, b):
            assert torch.equal(u, v), f"plan {plans[i]}: differs from the serial run"


def test_compiled_with_dynamic_rows_matches_eager() -> None:
    """TorchTitan's token count changes from step to step: one dynamic-shape graph."""
    torch._dynamo.reset()
    compiled = torch.compile(torch.ops.nki.grouped_mm, backend="aot_eager", dynamic=True)
    w = _randn(3, 16, 8, seed=16).requires_grad_()
    for m, offs in ((37, [1, 30, 33]), (140, [0, 70, 140])):
        x = _randn(m, 16, seed=m).requires_grad_()
        out = compiled(x, w, _offs(offs))
        (dx, dw) = torch.autograd.grad(out.square().sum(), [x, w])
        xe, we = x.detach().requires_grad_(), w.detach().requires_grad_()
        ref = torch.ops.nki.grouped_mm(xe, we, _offs(offs))
        (dxe, dwe) = torch.autograd.grad(ref.square().sum(), [xe, we])
        assert torch.equal(out, ref) and torch.equal(dx, dxe) and torch.equal(dw, dwe), m
