"""Keys no query attends never contribute, whatever their K / V hold (issue 31), on every
non-decode path: varlen documents with keys but no queries, dense masks read back as row
intervals with holes, per-head dense masks, FlexAttention block masks. Plus the mask
values that are not masks (NaN / +inf in an additive attn_mask) and score_mods that are
not additive at the call's real scores, which are refused by name."""

from __future__ import annotations

import pytest
import torch

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)
from nki_kernels.attention import flex
from nki_kernels.ops.attention import flash_attention, flash_attention_varlen, flex_attention

NAN, INF = float("nan"), float("inf")


def _run(fn, q, k, v):  # type: ignore[no-untyped-def]
    """out and (dq, dk, dv) of fn(q, k, v) for a fixed output gradient."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    g = torch.Generator().manual_seed(7)
    out.backward(torch.randn(out.shape, generator=g))
    return out.detach(), (q.grad, k.grad, v.grad)


def _poisoned(k, v, key_index, bad):  # type: ignore[no-untyped-def]
    k2, v2 = k.clone(), v.clone()
    k2[key_index] = bad
    v2[key_index] = bad
    return k2, v2


def _assert_unaffected(fn, q, k, v, key_index, bad) -> None:  # type: ignore[no-untyped-def]
    """Poisoning the unattended keys `key_index` changes no output and no gradient, and
    their own gradients are exactly 0."""
    clean_out, clean_grads = _run(fn, q, k, v)
    k2, v2 = _poisoned(k, v, key_index, bad)
    out, grads = _run(fn, q, k2, v2)
    assert torch.isfinite(out).all(), f"{int((~torch.isfinite(out)).sum())} non-finite outputs"
    torch.testing.assert_close(out, clean_out, atol=0.0, rtol=0.0)
    for name, got, want in zip(("dq", "dk", "dv"), grads, clean_grads):
        assert torch.isfinite(got).all(), f"{name}: {int((~torch.isfinite(got)).sum())} non-finite"
        torch.testing.assert_close(got, want, atol=0.0, rtol=0.0, msg=name)
    for name, got in zip(("dk", "dv"), grads[1:]):
        assert (got[key_index] == 0).all(), f"{name} of an unattended key is not 0"


@pytest.mark.parametrize("bad", [NAN, INF])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_document_with_keys_but_no_queries(bad: float, causal: bool) -> None:
    g = torch.Generator().manual_seed(0)
    cq = torch.tensor([0, 3, 3, 6], dtype=torch.int32)  # document 1: no queries
    ck = torch.tensor([0, 3, 5, 8], dtype=torch.int32)  # ... but keys 3 and 4
    q = torch.randn(6, 2, 16, generator=g)
    k, v = torch.randn(8, 2, 16, generator=g), torch.randn(8, 2, 16, generator=g)

    def fn(q, k, v):  # type: ignore[no-untyped-def]
        return flash_attention_varlen(q, k, v, cq, ck, 3, 3, causal=causal)

    _assert_unaffected(fn, q, k, v, (slice(3, 5),), bad)


def test_dense_interval_mask_with_a_hole_of_unattended_keys() -> None:
    """Every row one key interval (read back as bounds), their union with a hole."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (6, 8, 8))
    allowed = torch.zeros(6, 8, dtype=torch.bool)
    allowed[:3, :3] = True
    allowed[3:, 5:] = True

    def fn(q, k, v):  # type: ignore[no-untyped-def]
        return flash_attention(q, k, v, attn_mask=allowed)

    _assert_unaffected(fn, q, k, v, (slice(None), slice(None), slice(3, 5)), NAN)


@pytest.mark.parametrize("additive", [False, True])
def test_per_head_dense_mask_key_unattended_by_one_head_only(additive: bool) -> None:
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (6, 8, 8))
    allowed = torch.ones(1, 2, 6, 8, dtype=torch.bool)
    allowed[0, 1, :, 3] = False  # head 1 never attends key 3; head 0 does
    allowed[0, 0, :, 5] = False  # rows with gaps: the dense (tile) path
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, -INF) if additive else allowed

    def fn(q, k, v):  # type: ignore[no-untyped-def]
        return flash_attention(q, k, v, attn_mask=mask)

    _assert_unaffected(fn, q, k, v, (0, 1, 3), NAN)


def test_flex_block_mask_keys_no_query_of_a_head_attends() -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g) for _ in range(3))

    def mask_mod(b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        return (kv_idx % 4 != 1) | (h == 0)  # head 1 skips keys 1, 5, 9, ...

    bm = flex.create_block_mask(mask_mod, 1, 2, 40, 40)

    def fn(q, k, v):  # type: ignore[no-untyped-def]
        return flex_attention(q, k, v, block_mask=bm)

    _assert_unaffected(fn, q, k, v, (0, 1, slice(1, 40, 4)), INF)


@pytest.mark.parametrize("bad", [NAN, INF])
def test_a_nan_or_plus_inf_in_an_additive_mask_is_refused_by_name(bad: float) -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 4, 16, generator=g) for _ in range(3))
    mask = torch.zeros(4, 4)
    mask[1, 2] = bad
    with pytest.raises(ValueError, match=r"attn_mask: expected .* finite values or -inf.*got"):
        flash_attention(q, k, v, attn_mask=mask)


def _clamp5(s, b, h, i, j):  # type: ignore[no-untyped-def]
    return s.clamp(-5.0, 5.0)


def _inputs_with_large_scores() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5)
    return tuple(3 * torch.randn(1, 2, 20, 16, generator=g) for _ in range(3))


def test_a_score_mod_that_clamps_the_real_scores_is_refused() -> None:
    q, k, v = _inputs_with_large_scores()
    with pytest.raises(ValueError, match="score_mod: expected score"):
        flex_attention(q, k, v, score_mod=_clamp5)


def test_a_clamping_score_mod_is_refused_under_torch_compile_too() -> None:
    q, k, v = _inputs_with_large_scores()
    torch._dynamo.reset()
    fn = torch.compile(
        lambda q, k, v: flex_attention(q, k, v, score_mod=_clamp5),
        backend="aot_eager",
        fullgraph=True,
    )
    with pytest.raises(RuntimeError, match="score_mod: expected score"):
        fn(q, k, v)


def test_a_clamp_the_real_scores_never_reach_is_the_identity_and_runs() -> None:
    q, k, v = _inputs_with_large_scores()
    out = flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s.clamp(-1e4, 1e4))
    torch.testing.assert_close(out, flex_attention(q, k, v), atol=0.0, rtol=0.0)


_REAL_SCORES = flex.real_scores


def _check_in_blocks(monkeypatch, budget, q, k, score_mod, allowed=None):  # type: ignore[no-untyped-def]
    """additive_bias's check at a chunk budget: (outcome, sizes of the score blocks held)."""
    sizes: list[int] = []

    def spy(*args):  # type: ignore[no-untyped-def]
        s = _REAL_SCORES(*args)
        sizes.append(s.numel() * s.element_size())
        return s

    monkeypatch.setattr(flex, "CHECK_CHUNK_BYTES", budget)
    monkeypatch.setattr(flex, "real_scores", spy)
    b, hq, sq, _ = q.shape
    sk = k.shape[2]
    try:
        out = flex.additive_bias(score_mod, b, hq, sq, sk, q.device, q, k, None, None, allowed)
    except ValueError as e:
        return str(e), sizes
    return out, sizes


@pytest.mark.parametrize("rows", [1, 3, 20, 40])  # budgets: one row .. two heads per block
def test_the_score_mod_check_holds_one_bounded_block_of_scores_at_a_time(
    monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """The real scores are checked in blocks of at most CHECK_CHUNK_BYTES (never the whole
    [B, Hq, Sq, Sk] tensor), with the same verdict, location and bias as one block."""
    g = torch.Generator().manual_seed(7)
    q = 3 * torch.randn(2, 4, 20, 16, generator=g)
    k = 3 * torch.randn(2, 2, 20, 16, generator=g)  # GQA: each block finds its kv heads
    allowed = torch.rand(2, 1, 20, 20, generator=g) > 0.3
    whole = 4 * 2 * 4 * 20 * 20
    budget = rows * 20 * 4
    alibi = flex.alibi(flex.alibi_slopes(4))
    for score_mod in (_clamp5, alibi):
        one, one_sizes = _check_in_blocks(monkeypatch, whole, q, k, score_mod, allowed)
        got, sizes = _check_in_blocks(monkeypatch, budget, q, k, score_mod, allowed)
        assert one_sizes == [whole]
        assert max(sizes) <= budget
        if score_mod is _clamp5:
            assert isinstance(one, str) and "at [b, h, q, k]" in one
            assert got == one
        else:
            assert len(sizes) > 1 and sum(sizes) == whole  # passes: every score is checked
            torch.testing.assert_close(got, one, atol=0.0, rtol=0.0)


def test_the_score_mod_check_in_blocks_under_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = _inputs_with_large_scores()
    monkeypatch.setattr(flex, "CHECK_CHUNK_BYTES", 3 * 20 * 4)  # 3 query rows a block
    assert len(flex.check_boxes(1, 2, 20, 20)) == 14
    torch._dynamo.reset()

    def call(mod):  # type: ignore[no-untyped-def]
        return torch.compile(
            lambda q, k, v: flex_attention(q, k, v, score_mod=mod),
            backend="aot_eager",
            fullgraph=True,
        )

    with pytest.raises(RuntimeError, match="score_mod: expected score"):
        call(_clamp5)(q, k, v)
    wide = call(lambda s, b, h, i, j: s.clamp(-1e4, 1e4))(q, k, v)
    torch.testing.assert_close(wide, flex_attention(q, k, v), atol=0.0, rtol=0.0)


def test_a_head_that_attends_nothing_while_another_attends_the_tile() -> None:
    """One tile plan serves every head: head 1's keys (all unattended by head 1, whose
    rows are all empty) are read because head 0 attends their tile."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 2, 16, generator=g) for _ in range(3))
    allowed = torch.zeros(1, 2, 2, 2, dtype=torch.bool)
    allowed[0, 0] = True

    def fn(q, k, v):  # type: ignore[no-untyped-def]
        return flash_attention(q, k, v, attn_mask=allowed)

    _assert_unaffected(fn, q, k, v, (0, 1), NAN)


def test_varlen_offsets_on_another_device_are_named(neuron: str) -> None:
    q = torch.randn(4, 1, 16).to(neuron)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected device neuron"):
        flash_attention_varlen(q, q, q, cu, cu.to(neuron), 4, 4)
