"""Dense attn_mask (bool and additive) and block-sparse tile maps, forward and backward,
against float64 torch SDPA; fully masked rows; skipped tiles issue no instruction."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _helpers import TOLERANCES, assert_rel_close

from nki_kernels.attention import masks
from nki_kernels.attention.flash_fwd import flash_attention_fwd
from nki_kernels.attention.host import DenseMask, dense_operands
from nki_kernels.interp import TensorSpec, run
from nki_kernels.ops.attention import SdpaFallbackWarning, flash_attention, sdpa

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _inputs(b, hq, hkv, sq, sk, d, dtype, seed=0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(b, h, s, d, generator=g).to(dtype).requires_grad_()
        for h, s in ((hq, sq), (hkv, sk), (hkv, sk))
    ]


def _reference(q, k, v, grad, mask, **kw):  # type: ignore[no-untyped-def]
    """float64 torch SDPA (its math path), out and (dq, dk, dv)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    m = mask if mask.dtype == torch.bool else mask.double()
    out = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=m, enable_gqa=True, **kw)
    out.backward(grad.double())
    return out.detach(), (q64.grad, k64.grad, v64.grad)


def _random_mask(shape, kind, seed=1):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(shape, generator=g) > 0.4
    if kind == "bool":
        return allowed
    add = torch.randn(shape, generator=g)
    return add.masked_fill(~allowed, float("-inf"))


CASES = [
    # (b, hq, hkv, sq, sk, mask shape, kind)
    (2, 4, 2, 77, 200, (2, 1, 77, 200), "bool"),
    (1, 2, 1, 130, 90, (1, 2, 130, 90), "additive"),
    (2, 2, 2, 64, 150, (64, 150), "bool"),
    (1, 4, 1, 100, 260, (4, 100, 260), "additive"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[-1]}-{len(c[-2])}d" for c in CASES])
def test_dense_mask_forward_backward(case: tuple, dtype: torch.dtype) -> None:
    b, hq, hkv, sq, sk, mshape, kind = case
    q, k, v = _inputs(b, hq, hkv, sq, sk, 64, dtype)
    mask = _random_mask(mshape, kind)
    if kind == "additive":
        mask = mask.to(dtype)
    out = flash_attention(q, k, v, attn_mask=mask)
    grad = torch.randn(out.shape).to(dtype)
    out.backward(grad)
    ref, ref_grads = _reference(q, k, v, grad, mask)
    tol_out, tol_grad = TOLERANCES[dtype]
    assert_rel_close(out, ref, tol_out, "out")
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref_grads):
        assert_rel_close(got, want, tol_grad, name)


def test_mask_combines_with_causal_and_kv_lens() -> None:
    q, k, v = _inputs(2, 2, 1, 90, 140, 64, torch.float32)
    mask = _random_mask((2, 1, 90, 140), "bool")
    kv_lens = torch.tensor([140, 61])
    out = flash_attention(q, k, v, attn_mask=mask, causal=True, kv_lens=kv_lens)
    grad = torch.randn(out.shape)
    out.backward(grad)
    keys = torch.arange(140)
    causal = keys[None, :] <= torch.arange(90)[:, None] + 50  # bottom-right
    both = mask & causal & (keys < kv_lens.view(2, 1, 1, 1))
    ref, ref_grads = _reference(q, k, v, grad, both)
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")
    for got, want in zip((q.grad, k.grad, v.grad), ref_grads):
        assert_rel_close(got, want, TOLERANCES[torch.float32][1], "grad")


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_fully_masked_rows_return_what_torch_returns(kind: str) -> None:
    """torch 2.13's SDPA (and flex_attention) give 0 for a row without allowed keys, and
    0 gradients; the op does too, with lse = -inf."""
    q, k, v = _inputs(1, 2, 2, 40, 70, 64, torch.float32)
    allowed = _random_mask((1, 2, 40, 70), "bool")
    allowed[0, 0, 3] = False
    allowed[0, 1, 17:20] = False
    mask = (
        allowed if kind == "bool" else torch.zeros(allowed.shape).masked_fill(~allowed, -torch.inf)
    )
    out, lse = flash_attention(q, k, v, attn_mask=mask, return_lse=True)
    grad = torch.randn(out.shape)
    out.backward(grad)
    ref, ref_grads = _reference(q, k, v, grad, mask)
    assert torch.isfinite(ref).all() and (ref[0, 0, 3] == 0).all()  # torch's own answer
    assert (out[0, 0, 3] == 0).all() and (out[0, 1, 17:20] == 0).all()
    assert torch.isneginf(lse[0, 0, 3]) and torch.isneginf(lse[0, 1, 17:20]).all()
    assert torch.isfinite(lse[0, 0, 4])
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")
    assert q.grad is not None and (q.grad[0, 0, 3] == 0).all()
    for got, want in zip((q.grad, k.grad, v.grad), ref_grads):
        assert_rel_close(got, want, TOLERANCES[torch.float32][1], "grad")


def test_nan_keys_at_masked_positions_do_not_contribute() -> None:
    """select_reduce replaces masked scores whatever they are (a NaN key included)."""
    q, k, v = _inputs(1, 1, 1, 50, 130, 64, torch.float32)
    mask = torch.ones(50, 130, dtype=torch.bool)
    mask[:, 7] = False
    kn = k.detach().clone()
    kn[0, 0, 7] = float("nan")
    out = flash_attention(q.detach(), kn, v.detach(), attn_mask=mask)
    ref, _ = _reference(q, k, v, torch.zeros(1, 1, 50, 64), mask)
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")


def test_sdpa_keeps_a_dense_mask_on_the_kernel() -> None:
    q, k, v = (t.detach() for t in _inputs(1, 2, 2, 60, 60, 64, torch.float32))
    mask = _random_mask((1, 1, 60, 60), "bool")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SdpaFallbackWarning)
        out = sdpa(q, k, v, attn_mask=mask)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")


def test_bad_masks_name_the_argument() -> None:
    q, k, v = (t.detach() for t in _inputs(1, 2, 2, 60, 50, 64, torch.float32))
    with pytest.raises(ValueError, match=r"attn_mask: expected a shape broadcastable"):
        flash_attention(q, k, v, attn_mask=torch.ones(60, 49, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"attn_mask: expected dtype bool, .*; got int32"):
        flash_attention(q, k, v, attn_mask=torch.ones(60, 50, dtype=torch.int32))


# ---- block-sparse maps -------------------------------------------------------------------
def _block_mask(nq: int, nk: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A [1, 1, 128 nq, 128 nk] mask whose tiles are empty, full or partial at random."""
    rng = np.random.default_rng(seed)
    kinds = rng.integers(0, 3, size=(nq, nk))  # 0 empty, 1 partial, 2 full
    kinds[:, 0] = 2  # every row keeps a key
    tile = np.kron(kinds == 2, np.ones((128, 128), dtype=bool))
    part = np.kron(kinds == 1, np.ones((128, 128), dtype=bool))
    allowed = tile | (part & (rng.random(tile.shape) > 0.5))
    return allowed[None, None], kinds


def test_block_map_classifies_empty_full_and_partial_tiles() -> None:
    allowed, kinds = _block_mask(3, 5, seed=2)
    classes = masks.classify_dense(allowed)
    expected = np.choose(kinds, [masks.SKIP, masks.PARTIAL, masks.FULL])
    np.testing.assert_array_equal(classes[0], expected)


@pytest.mark.parametrize(
    "backend,device", [("eager", "cpu"), ("aot_eager", "cpu"), ("aot_eager", "neuron")]
)
def test_random_block_sparse_mask_matches_torch(
    backend: str, device: str, request: pytest.FixtureRequest
) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    allowed, kinds = _block_mask(2, 4, seed=3)
    assert {0, 1, 2} <= set(kinds.ravel().tolist())
    q, k, v = (
        t.detach().to(device).requires_grad_()
        for t in _inputs(1, 2, 1, 256, 512, 64, torch.bfloat16)
    )
    mask = torch.from_numpy(allowed)

    def f(q, k, v, mask):  # type: ignore[no-untyped-def]
        return flash_attention(q, k, v, attn_mask=mask)

    fn = f if backend == "eager" else torch.compile(f, backend=backend, fullgraph=True)
    out = fn(q, k, v, mask.to(device))
    assert out.device.type == q.device.type
    grad = torch.randn(out.shape).to(torch.bfloat16)
    out.backward(grad.to(device))
    ref, ref_grads = _reference(q.cpu(), k.cpu(), v.cpu(), grad, mask)
    tol_out, tol_grad = TOLERANCES[torch.bfloat16]
    assert_rel_close(out, ref, tol_out, "out")
    for got, want in zip((q.grad, k.grad, v.grad), ref_grads):
        assert got is not None and got.device.type == q.device.type
        assert_rel_close(got, want, tol_grad, "grad")


def _fwd_trace(allowed: np.ndarray, heads: int = 2):  # type: ignore[no-untyped-def]
    sq, sk = allowed.shape[-2:]
    plan, mask_t, _ = dense_operands(DenseMask(allowed, None), 0, sk, torch.device("cpu"))
    q = TensorSpec((1, heads, sq, 64), "bfloat16")
    kv = TensorSpec((1, 1, sk, 64), "bfloat16")
    mk = TensorSpec(tuple(mask_t.shape), "uint8")
    args = (q, kv, kv, None, 0.125, plan, 512, 1, 3, 6, 1, mk, None)
    return run(flash_attention_fwd, *args, target="trn2", trace_only=True).trace


def test_skipped_tiles_are_not_computed() -> None:
    """P @ V matmuls (N = D) scale with the non-empty tiles, mask loads and selects with
    the partial ones; an empty tile issues nothing."""
    counts = []
    for seed in (4, 5, 6):
        allowed, kinds = _block_mask(4, 8, seed)
        trace = _fwd_trace(allowed)
        pv = sum(1 for i in trace if i.opcode == "nc_matmul" and i.attrs["N"] == 64)
        sel = [i for i in trace if i.opcode == "select_reduce"]
        loads = [i for i in trace if i.opcode == "dma_copy" and i.dtype == "uint8"]
        live, partial = int((kinds != 0).sum()), int((kinds == 1).sum())
        assert pv == 2 * live  # one P @ V matmul per (head, non-empty tile)
        assert sum(i.p * i.n for i in sel) == 2 * partial * 128 * 128
        assert sum(i.nbytes for i in loads) == 2 * partial * 128 * 128  # uint8
        counts.append((live, len(trace)))
    counts.sort()
    assert counts[0][1] < counts[-1][1] or counts[0][0] == counts[-1][0]


@pytest.mark.parametrize(
    "backend,device",
    [("eager", "cpu"), ("aot_eager", "cpu"), ("eager", "neuron"), ("aot_eager", "neuron")],
)
def test_dense_mask_on_devices_and_under_compile(
    backend: str, device: str, request: pytest.FixtureRequest
) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    q, k, v = (
        t.detach().to(device).requires_grad_() for t in _inputs(1, 2, 1, 70, 90, 64, torch.bfloat16)
    )
    mask = _random_mask((1, 2, 70, 90), "additive").to(torch.bfloat16)

    def f(q, k, v, mask):  # type: ignore[no-untyped-def]
        return flash_attention(q, k, v, attn_mask=mask)

    fn = f if backend == "eager" else torch.compile(f, backend=backend, fullgraph=True)
    out = fn(q, k, v, mask.to(device))
    grad = torch.randn(out.shape).to(torch.bfloat16)
    out.backward(grad.to(device))
    assert out.device.type == q.device.type
    ref, ref_grads = _reference(q.cpu(), k.cpu(), v.cpu(), grad, mask)
    tol_out, tol_grad = TOLERANCES[torch.bfloat16]
    assert_rel_close(out, ref, tol_out, "out")
    for got, want in zip((q.grad, k.grad, v.grad), ref_grads):
        assert got is not None and got.device.type == q.device.type
        assert_rel_close(got, want, tol_grad, "grad")


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_opcheck_with_a_dense_mask(kind: str) -> None:
    """The op's own examples carry no mask: opcheck (schema, fake strides, autograd
    registration, aot_dispatch) on the dense-mask path, the mask broadcast over heads."""
    q, k, v = _inputs(1, 2, 1, 70, 90, 64, torch.float32)
    mask = _random_mask((1, 1, 70, 90), kind)
    torch.library.opcheck(torch.ops.nki.flash_attention.default, (q, k, v), {"attn_mask": mask})
