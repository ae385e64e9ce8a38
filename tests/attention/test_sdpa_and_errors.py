"""`nki_kernels.ops.attention.sdpa` (torch SDPA signature, fallback with one warning per
reason) and the op's argument errors (each names the argument, expected and received)."""

from __future__ import annotations

import re
import threading
import time
import warnings

import pytest
import torch
from _helpers import TOLERANCES, assert_rel_close, make_inputs

import nki_kernels.ops.attention as attn
from nki_kernels.ops.attention import SdpaFallbackWarning, flash_attention, sdpa
from nki_kernels.ops.decode import decode_attention

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
F = torch.nn.functional


@pytest.mark.parametrize(
    "kw,hkv",
    [({}, 2), ({"is_causal": True}, 2), ({"scale": 0.3}, 2), ({"enable_gqa": True}, 1)],
    ids=["plain", "causal", "scale", "gqa"],
)
def test_sdpa_served_by_the_kernel_matches_torch(kw: dict, hkv: int) -> None:
    q, k, v = make_inputs(1, 2, hkv, 70, 70, 64, torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SdpaFallbackWarning)
        out = sdpa(q, k, v, **kw)
    ref = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), **kw)
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")


class _SlowSet(set):
    """A set whose membership test yields the GIL: an unlocked check-then-add from several
    threads then lets more than one thread through, instead of rarely."""

    def __contains__(self, item: object) -> bool:
        found = super().__contains__(item)
        time.sleep(1e-4)
        return found


def test_sdpa_warns_once_per_reason_and_gives_the_serial_result_under_threads(
    monkeypatch,
) -> None:
    monkeypatch.setattr(attn, "_WARNED", _SlowSet())
    g = torch.Generator().manual_seed(0)
    inputs = [tuple(torch.randn(2, 5, 16, generator=g) for _ in range(3)) for _ in range(3)]
    want = [F.scaled_dot_product_attention(*qkv) for qkv in inputs]  # 3-D: the fallback
    threads, per_thread = 6, 4
    start = threading.Barrier(threads)
    got: dict[tuple[int, int], torch.Tensor] = {}

    def work(t: int) -> None:
        start.wait()
        for n in range(per_thread):
            got[t, n] = sdpa(*inputs[(t + n) % len(inputs)])

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    fallbacks = [w for w in rec if issubclass(w.category, SdpaFallbackWarning)]
    assert len(fallbacks) == 1 and "not 4-D" in str(fallbacks[0].message)
    assert len(got) == threads * per_thread
    for (t, n), out in got.items():
        assert torch.equal(out, want[(t + n) % len(inputs)]), (t, n)


@pytest.mark.parametrize(
    "case,reason",
    [
        ("dropout", "dropout_p=0.5"),
        ("causal-rect", "is_causal with Sq != Sk"),
        ("3d", "not 4-D"),
    ],
)
def test_sdpa_falls_back_with_one_warning_naming_the_reason(case: str, reason: str) -> None:
    attn._WARNED.clear()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    kw: dict = {}
    if case == "dropout":
        kw["dropout_p"] = 0.5
    elif case == "causal-rect":
        k, v = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
        kw["is_causal"] = True
    else:
        q, k, v = q[0], k[0], v[0]
    for _ in range(2):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            torch.manual_seed(1)
            out = sdpa(q, k, v, **kw)
        fallbacks = [w for w in rec if issubclass(w.category, SdpaFallbackWarning)]
        if _ == 0:
            assert len(fallbacks) == 1 and reason in str(fallbacks[0].message)
        else:
            assert not fallbacks  # one warning per reason
    torch.manual_seed(1)
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(out, ref)


def _qkv(**over):  # type: ignore[no-untyped-def]
    q, k, v = (t.detach() for t in make_inputs(1, 4, 2, 16, 24, 64, torch.float32))
    return over.get("q", q), over.get("k", k), over.get("v", v)


BAD = [
    (
        dict(q=torch.randn(1, 4, 16, 272)),
        {},
        ValueError,
        "q: expected head_dim (dim 3) <= 256; got 272",
    ),
    (
        dict(k=torch.randn(1, 3, 24, 64), v=torch.randn(1, 3, 24, 64)),
        {},
        ValueError,
        "k: expected a number of heads dividing q's 4 (GQA / MQA); got 3",
    ),
    (
        dict(k=torch.randn(2, 2, 24, 64), v=torch.randn(2, 2, 24, 64)),
        {},
        ValueError,
        "k: expected batch 1 (as q); got 2",
    ),
    (
        dict(k=torch.randn(1, 2, 24, 32), v=torch.randn(1, 2, 24, 32)),
        {},
        ValueError,
        "k: expected head_dim 64 (as q); got 32",
    ),
    (
        dict(v=torch.randn(1, 2, 25, 64)),
        {},
        ValueError,
        "v: expected shape (1, 2, 24, 64) (as k); got (1, 2, 25, 64)",
    ),
    (
        dict(q=torch.ones(1, 4, 16, 64, dtype=torch.int64)),
        {},
        TypeError,
        "q: expected dtype float32, bfloat16, float16; got int64",
    ),
    (
        dict(k=torch.randn(1, 2, 24, 64).bfloat16()),
        {},
        TypeError,
        "k: expected dtype float32 (as q); got bfloat16",
    ),
    (
        dict(q=torch.randn(4, 16, 64)),
        {},
        ValueError,
        "q: expected at least 4 dim(s); got shape (4, 16, 64)",
    ),
    (
        {},
        {"sliding_window": 0},
        ValueError,
        "sliding_window: expected an int >= 1 (the W most recent keys); got 0",
    ),
    ({}, {"softmax_scale": -1.0}, ValueError, "softmax_scale: expected a number > 0; got -1.0"),
    (
        {},
        {"kv_lens": torch.tensor([3, 4])},
        ValueError,
        "kv_lens: expected shape (1,) [B]; got (2,)",
    ),
    (
        {},
        {"kv_lens": torch.tensor([30])},
        ValueError,
        "kv_lens: expected values in [0, 24] (Sk); got min 30, max 30",
    ),
    (
        {},
        {"segment_ids": torch.zeros(1, 16, dtype=torch.int64)},
        ValueError,
        "segment_ids: packed documents need Sq == Sk; got Sq = 16, Sk = 24",
    ),
    (
        dict(k=torch.randn(1, 2, 16, 64), v=torch.randn(1, 2, 16, 64)),
        {"segment_ids": torch.zeros(1, 15, dtype=torch.int64)},
        ValueError,
        "segment_ids: expected shape (1, 16) [B, S]; got (1, 15)",
    ),
    (
        dict(k=torch.randn(1, 2, 16, 64), v=torch.randn(1, 2, 16, 64)),
        {"segment_ids": torch.tensor([[0] * 8 + [1] * 4 + [0] * 4])},
        ValueError,
        "segment_ids: each document must be one contiguous run",
    ),
]


@pytest.mark.parametrize(
    "over,kw,exc,msg", BAD, ids=[b[3].split(":")[0] + str(i) for i, b in enumerate(BAD)]
)
def test_bad_input_names_the_argument(over: dict, kw: dict, exc: type, msg: str) -> None:
    q, k, v = _qkv(**over)
    with pytest.raises(exc, match=re.escape(msg)):
        flash_attention(q, k, v, **kw)


def test_bad_input_fails_the_same_way_under_compile() -> None:
    torch._dynamo.reset()
    q, k, v = _qkv(q=torch.randn(1, 4, 16, 272))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flash_attention(q, k, v)

    with pytest.raises(Exception, match=re.escape("q: expected head_dim (dim 3) <= 256; got 272")):
        torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)


def test_wrong_device_is_rejected(neuron: str) -> None:
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=re.escape(f"k: expected device cpu (as q); got {neuron}")):
        flash_attention(q, k.to(neuron), v)


def test_bucket_policy_off_the_tile_grid_is_rejected_by_name() -> None:
    """Explicit buckets may be any size (the norms and MoE pad rows to them), but the
    attention kernels tile queries and keys by 128: a bucket of 200 used to fail deep in
    the host code ("The size of tensor a (200) must match ... (256)")."""
    q, k, v = (torch.randn(1, 2, 150, 16) for _ in range(3))
    msg = "bucket_policy: expected buckets that are multiples of 128 for flash_attention"
    with pytest.raises(ValueError, match=re.escape(msg) + r".*got 200 for Sq = 150"):
        flash_attention(q, k, v, bucket_policy="200")
    out = flash_attention(q, k, v, bucket_policy="256")
    ref = F.scaled_dot_product_attention(q, k, v)
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")


def test_python_entry_points_name_a_non_tensor_argument() -> None:
    """A NumPy array or list where a tensor is meant is a TypeError naming the argument
    (flash_attention used to raise the schema's RuntimeError, flash_attention_varlen an
    AttributeError)."""
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"q: expected a tensor; got ndarray"):
        flash_attention(q.numpy(), k, v)
    with pytest.raises(TypeError, match=r"v: expected a tensor; got list"):
        attn.flash_attention_varlen(
            q[0], k[0], [1.0], torch.tensor([0, 4]), torch.tensor([0, 4]), 4, 4
        )
    with pytest.raises(TypeError, match=r"key: expected a tensor; got ndarray"):
        attn.flex_attention(q, k.numpy(), v)
    with pytest.raises(TypeError, match=r"cache_lens: expected a tensor; got list"):
        decode_attention(q[:, :, :1], k, v, [16])


def test_a_learnable_additive_mask_is_not_silently_left_without_gradient() -> None:
    """The kernels give no gradient for `attn_mask`; a bias that requires grad (T5 / ALiBi
    style learnable bias) used to get `.grad = None` silently. `sdpa` now hands such calls
    to torch (one warning naming the reason; the gradient is torch's), and the op refuses
    them by name, up front in the Python API and in the backward for direct op calls."""
    attn._WARNED.clear()
    q, k, v = make_inputs(1, 2, 2, 9, 9, 16, torch.float32)
    bias = torch.randn(1, 2, 9, 9, requires_grad=True)
    with pytest.warns(SdpaFallbackWarning, match="attn_mask that requires grad"):
        out = sdpa(q, k, v, attn_mask=bias)
    out.sum().backward()
    ref_bias = bias.detach().clone().requires_grad_()
    F.scaled_dot_product_attention(
        q.detach(), k.detach(), v.detach(), attn_mask=ref_bias
    ).sum().backward()
    torch.testing.assert_close(bias.grad, ref_bias.grad)
    msg = "attn_mask: expected a mask that does not require grad"
    with pytest.raises(ValueError, match=re.escape(msg)):
        flash_attention(q, k, v, attn_mask=bias)
    out, _ = torch.ops.nki.flash_attention(q, k, v, attn_mask=bias)
    with pytest.raises(ValueError, match=re.escape(msg)):
        out.sum().backward()
    with torch.no_grad():  # no autograd: nothing to refuse
        flash_attention(q, k, v, attn_mask=bias)


def test_flex_score_mod_with_a_learnable_tensor_is_refused() -> None:
    """ALiBi slopes that require grad used to train silently without a gradient."""
    q, k, v = make_inputs(1, 2, 2, 9, 9, 16, torch.float32)
    slopes = torch.tensor([0.5, 0.25], requires_grad=True)

    def alibi(score, b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        return score + slopes[h] * (kv_idx - q_idx)

    with pytest.raises(ValueError, match=r"score_mod: expected no learnable tensors"):
        attn.flex_attention(q, k, v, score_mod=alibi)
