"""FlexAttention-style mask_mod / score_mod on the kernels: forward against
torch.nn.attention.flex_attention (float64, its CPU path), forward and backward against
a float64 math reference that applies the same functions to the full score matrix."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _helpers import LSE_ATOL, TOLERANCES, assert_rel_close
from torch.nn.attention import flex_attention as torch_flex

from nki_kernels.attention import flex, masks
from nki_kernels.ops.attention import flex_attention

pytestmark = [
    pytest.mark.filterwarnings("ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

B, HQ, HKV, SQ, SK, D = 2, 4, 2, 150, 200, 64
DOCS = torch.tensor([[0] * 60 + [1] * 1 + [2] * 139, [0] * 200])
MASKS = {
    "causal": flex.causal_mask,
    "window": flex.sliding_window_mask(37),
    "prefix_lm": flex.prefix_lm_mask(45),
    "document": flex.document_mask(DOCS),
    "document+causal": flex.and_masks(flex.document_mask(DOCS), flex.causal_mask),
}
SLOPES = flex.alibi_slopes(HQ)
SCORES = {
    "alibi": flex.alibi(SLOPES),
    "softcap": flex.softcap(3.0),
    "softcap+alibi": flex.softcap(3.0, then=flex.alibi(SLOPES)),
}


def _inputs(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, HQ, SQ, D), (B, HKV, SK, D), (B, HKV, SK, D))
    return [(2 * torch.randn(s, generator=g)).to(dtype).requires_grad_() for s in shapes]


def _grids() -> tuple[torch.Tensor, ...]:
    return (
        torch.arange(B).view(B, 1, 1, 1),
        torch.arange(HQ).view(1, HQ, 1, 1),
        torch.arange(SQ).view(1, 1, SQ, 1),
        torch.arange(SK).view(1, 1, 1, SK),
    )


def _math_reference(q, k, v, grad, mask_mod, score_mod):  # type: ignore[no-untyped-def]
    """float64 softmax(score_mod(scale q k^T)) restricted to mask_mod, empty rows 0."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kk, vv = (t.repeat_interleave(HQ // HKV, dim=1) for t in (k64, v64))
    s = q64 @ kk.transpose(-1, -2) / math.sqrt(D)
    if score_mod is not None:
        s = score_mod(s, *_grids())
    allowed = torch.ones(s.shape, dtype=torch.bool)
    if mask_mod is not None:
        allowed = allowed & mask_mod(*_grids())
    s = s.masked_fill(~allowed, -math.inf)
    live = allowed.any(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~live, 0.0), dim=-1).masked_fill(~live, 0.0)
    out = p @ vv
    out.backward(grad.double())
    return out.detach(), (q64.grad, k64.grad, v64.grad)


def _check(q, k, v, mask_mod, score_mod, dtype):  # type: ignore[no-untyped-def]
    bm = flex.create_block_mask(mask_mod, B, None, SQ, SK) if mask_mod is not None else None
    out, lse = flex_attention(
        q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True, return_lse=True
    )
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    out.backward(grad)
    ref, ref_grads = _math_reference(q, k, v, grad, mask_mod, score_mod)
    tol_out, tol_grad = TOLERANCES[dtype]
    assert_rel_close(out, ref, tol_out, "out")
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref_grads):
        assert_rel_close(got, want, tol_grad, name)
    if dtype == torch.float32:  # torch's own flex_attention (CPU: forward only)
        tbm = None
        if mask_mod is not None:
            tbm = torch_flex.create_block_mask(mask_mod, B, None, SQ, SK, device="cpu")
        t_out, t_lse = torch_flex.flex_attention(
            *(t.detach().double() for t in (q, k, v)),
            score_mod=score_mod,
            block_mask=tbm,
            enable_gqa=True,
            return_lse=True,
        )
        assert_rel_close(out, t_out, tol_out, "out vs torch flex_attention")
        fin = torch.isfinite(t_lse)
        assert torch.equal(fin, torch.isfinite(lse))
        torch.testing.assert_close(lse[fin].double(), t_lse[fin], atol=LSE_ATOL, rtol=1e-5)


@pytest.mark.parametrize("name", list(MASKS))
def test_mask_mods(name: str) -> None:
    q, k, v = _inputs(torch.float32)
    _check(q, k, v, MASKS[name], None, torch.float32)


@pytest.mark.parametrize("name", list(SCORES))
def test_score_mods(name: str) -> None:
    q, k, v = _inputs(torch.float32)
    _check(q, k, v, flex.causal_mask, SCORES[name], torch.float32)


@pytest.mark.parametrize(
    "mask,score", [("window", "softcap"), ("prefix_lm", "alibi"), ("document+causal", None)]
)
def test_combinations_bf16(mask: str, score: str | None) -> None:
    q, k, v = _inputs(torch.bfloat16)
    _check(q, k, v, MASKS[mask], SCORES[score] if score else None, torch.bfloat16)


def test_softcap_without_a_mask() -> None:
    q, k, v = _inputs(torch.float32, seed=3)
    _check(q, k, v, None, flex.softcap(2.0), torch.float32)


def test_interval_masks_use_bounds_and_others_load_tiles() -> None:
    """Affine-shaped masks (one key interval per row, all heads alike) are applied with
    range_select against bounds; a per-head or gapped mask loads its PARTIAL tiles."""
    for name in ("causal", "window", "prefix_lm", "document+causal"):
        allowed = flex.create_block_mask(MASKS[name], B, None, SQ, SK).allowed.numpy()
        assert masks.row_intervals(allowed[:, 0]) is not None, name

    def stripes(b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        return (kv_idx % 3 == 0) | (q_idx == kv_idx)

    allowed = flex.create_block_mask(stripes, None, None, SQ, SK).allowed.numpy()
    assert masks.row_intervals(allowed[:, 0]) is None
    q, k, v = _inputs(torch.float32)
    _check(q, k, v, stripes, None, torch.float32)


def test_block_mask_is_vectorized_and_matches_torch() -> None:
    for name, mod in MASKS.items():
        ours = flex.create_block_mask(mod, B, None, SQ, SK)
        theirs = torch_flex.create_block_mask(mod, B, None, SQ, SK, device="cpu")
        dense = theirs.to_dense()  # [B, 1, nq, nk] tiles torch computes (its block size 128)
        want = dense[:, 0].numpy() > 0
        live = np.broadcast_to(ours.tile_classes() != masks.SKIP, want.shape)
        np.testing.assert_array_equal(live, want, err_msg=name)


def test_scalar_written_mask_mod_is_vmapped() -> None:
    def scalar_causal(b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        # stacking needs equal shapes: fails on broadcast grids, works on vmapped scalars
        return torch.stack([kv_idx, q_idx]).diff()[0] >= 0  # q_idx - kv_idx >= 0

    a = flex.create_block_mask(scalar_causal, None, None, 70, 90).allowed
    b = flex.create_block_mask(flex.causal_mask, None, None, 70, 90).allowed
    assert torch.equal(a, b)


def test_non_additive_score_mod_is_rejected() -> None:
    q, k, v = (t.detach() for t in _inputs(torch.float32))
    with pytest.raises(ValueError, match="score_mod: expected score"):
        flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s * 2.0, enable_gqa=True)
    with pytest.raises(ValueError, match="key: expected 4 heads"):
        flex_attention(q, k, v)


@pytest.mark.parametrize(
    "backend,device,score",
    [
        ("aot_eager", "cpu", "alibi"),
        ("eager", "neuron", "softcap+alibi"),
        ("aot_eager", "neuron", "alibi"),
        ("aot_eager", "neuron", "softcap"),
    ],
)
def test_flex_on_devices_and_under_torch_compile_fullgraph(
    backend: str, device: str, score: str, request: pytest.FixtureRequest
) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    q, k, v = (t.detach().to(device).requires_grad_() for t in _inputs(torch.float32))
    bm = flex.create_block_mask(MASKS["window"], B, None, SQ, SK)
    mod = SCORES[score]

    def f(q, k, v):  # type: ignore[no-untyped-def]
        return flex_attention(q, k, v, score_mod=mod, block_mask=bm, enable_gqa=True)

    fn = f if backend == "eager" else torch.compile(f, backend=backend, fullgraph=True)
    out = fn(q, k, v)
    assert out.device.type == q.device.type
    grad = torch.randn(out.shape)
    out.backward(grad.to(device))
    ref, ref_grads = _math_reference(q.cpu(), k.cpu(), v.cpu(), grad, MASKS["window"], mod)
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")
    for got, want in zip((q.grad, k.grad, v.grad), ref_grads):
        assert got is not None and got.device.type == q.device.type
        assert_rel_close(got, want, TOLERANCES[torch.float32][1], "grad")


def test_torch_block_mask_is_accepted() -> None:
    q, k, v = (t.detach() for t in _inputs(torch.float32, seed=5))
    tbm = torch_flex.create_block_mask(MASKS["window"], B, None, SQ, SK, device="cpu")
    out = flex_attention(q, k, v, block_mask=tbm, enable_gqa=True)
    ours = flex_attention(
        q,
        k,
        v,
        block_mask=flex.create_block_mask(MASKS["window"], B, None, SQ, SK),
        enable_gqa=True,
    )
    torch.testing.assert_close(out, ours, rtol=0, atol=0)
    with pytest.raises(TypeError, match="block_mask: expected a BlockMask"):
        flex_attention(q, k, v, block_mask=torch.ones(SQ, SK, dtype=torch.bool), enable_gqa=True)


def test_interval_masks_reach_the_kernel_as_bounds_and_gapped_ones_as_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the forward kernel is launched with: an interval mask_mod passes row bounds
    and no mask tile (range_select in the kernel), a gapped one a uint8 mask tile."""
    from nki_kernels.attention import host

    seen: list[tuple[bool, bool]] = []
    real = host.launch

    def spy(kernel, *args, **kw):  # type: ignore[no-untyped-def]
        if kernel is host.flash_attention_fwd:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            seen.append((args[3] is not None, any(t.dtype == torch.uint8 for t in tensors)))
        return real(kernel, *args, **kw)

    monkeypatch.setattr(host, "launch", spy)

    def stripes(b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        return (kv_idx % 3 == 0) | (q_idx == kv_idx)

    q, k, v = (t.detach() for t in _inputs(torch.float32))
    for mod, want in (
        (MASKS["document+causal"], (True, False)),
        (MASKS["window"], (True, False)),
        (stripes, (False, True)),
    ):
        seen.clear()
        bm = flex.create_block_mask(mod, B, None, SQ, SK)
        flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
        assert seen and all(s == want for s in seen), (mod, seen)
