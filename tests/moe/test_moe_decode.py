"""The decode mode of moe_mlp / moe_experts (T <= 64, dropless): two grouped matmuls
instead of the blockwise kernel; which calls take it, and that it computes the same
layer as the blockwise path and the float64 loop."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from test_moe_experts import _case, _close, reference

import nki_kernels.ops.moe as moe_ops
import nki_kernels.ops.moe_decode as moe_decode
import nki_kernels.ops.moe_experts as experts_ops

F32, BF16 = torch.float32, torch.bfloat16

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _no_blockwise(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the blockwise forward ran")


def _no_decode(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the decode mode ran")


@pytest.mark.parametrize("t", [1, 8, 64])
def test_decode_sized_calls_take_the_decode_mode(monkeypatch: Any, t: int) -> None:
    x, w, ids, wgu, wd = _case(t, 16, 24, 6, 2, F32, seed=t)
    monkeypatch.setattr(moe_ops, "launch_experts_fwd", _no_blockwise)
    monkeypatch.setattr(experts_ops, "launch_experts_fwd", _no_blockwise)
    out = torch.ops.nki.moe_experts(x, w, ids, wgu, wd)
    _close(out, reference(x.double(), w.double(), ids, wgu.double(), wd.double()), F32, "out")
    logits = torch.randn(t, 6, generator=torch.Generator().manual_seed(t))
    assert torch.ops.nki.moe_mlp(x, logits, wgu, wd, top_k=2).shape == (t, 16)


def test_larger_or_capacity_limited_calls_take_the_blockwise_kernel(monkeypatch: Any) -> None:
    monkeypatch.setattr(moe_ops, "decode_experts", _no_decode)
    monkeypatch.setattr(experts_ops, "decode_experts", _no_decode)
    x, w, ids, wgu, wd = _case(65, 16, 24, 6, 2, F32, seed=1)
    torch.ops.nki.moe_experts(x, w, ids, wgu, wd)
    logits = torch.randn(65, 6, generator=torch.Generator().manual_seed(2))
    torch.ops.nki.moe_mlp(x, logits, wgu, wd, top_k=2)
    torch.ops.nki.moe_mlp(x[:8], logits[:8], wgu, wd, top_k=2, capacity_factor=1.0)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_decode_mode_matches_the_blockwise_path(monkeypatch: Any, dtype: Any) -> None:
    # experts 0 and 5 get no token, 1..4 a few each
    x, w, _, wgu, wd = _case(12, 32, 40, 6, 2, dtype, seed=7)
    ids = torch.tensor([[1 + t % 4, 1 + (t + 1) % 4] for t in range(12)])
    decoded = torch.ops.nki.moe_experts(x, w, ids, wgu, wd)
    monkeypatch.setattr(moe_decode, "DECODE_MAX_TOKENS", 0)
    blockwise = torch.ops.nki.moe_experts(x, w, ids, wgu, wd)
    ref = reference(x.double(), w.double(), ids, wgu.double(), wd.double())
    _close(decoded, ref, dtype, "decode mode")
    _close(blockwise, ref, dtype, "blockwise")


def test_nan_in_a_token_stays_in_its_row() -> None:
    x, w, ids, wgu, wd = _case(8, 16, 24, 4, 2, F32, seed=3)
    x[2, 5] = float("nan")
    w[6, 1] = float("inf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.ops.nki.moe_experts(x, w, ids, wgu, wd)
    assert (~torch.isfinite(out)).any(dim=1).nonzero().flatten().tolist() == [2, 6]
