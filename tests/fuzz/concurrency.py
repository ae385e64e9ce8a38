"""A mixed workload of every op family, run serially and from several threads at once.

Each call is fully determined by (kind, size index, seed, device): it makes its own
inputs, runs forward (and backward where the op has one) and returns every output and
gradient, so a threaded run can be compared bit for bit against the serial run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

import nki_kernels  # noqa: F401  (registers torch.ops.nki.*)
from nki_kernels.ops.attention import flash_attention_varlen
from nki_kernels.ops.decode import decode_attention
from nki_kernels.ops.moe_gated_experts import moe_gated_experts
from nki_kernels.ops.sinks import sink_attention

KINDS = ("attention", "varlen", "rms_norm", "layer_norm", "moe_mlp", "moe_gated", "decode",
         "sinks", "add_rms_norm")  # fmt: skip
Call = tuple[str, int, int, str]  # (kind, size index 0..2, seed, device)


def _leaves(device: str, g: torch.Generator, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    return [torch.randn(s, generator=g).to(device).requires_grad_(True) for s in shapes]


def _grads(out: torch.Tensor, leaves: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    grads = torch.autograd.grad(out.float().square().sum(), list(leaves))
    return [out.detach().cpu(), *(t.cpu() for t in grads)]


def run_call(call: Call) -> list[torch.Tensor]:
    """Every output and gradient of one call, on the CPU."""
    kind, size, seed, dev = call
    g = torch.Generator().manual_seed(seed)
    if kind == "attention":
        s = (5, 17, 40)[size]
        q, k, v = _leaves(dev, g, (1, 2, s, 16), (1, 1, s, 16), (1, 1, s, 16))
        out = torch.ops.nki.flash_attention(q, k, v, causal=bool(seed % 2))[0]
        return _grads(out, (q, k, v))
    if kind == "varlen":
        lens = ((3, 4), (1, 9, 2), (12, 5))[size]
        n = sum(lens)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        q, k, v = _leaves(dev, g, (n, 2, 16), (n, 2, 16), (n, 2, 16))
        out = flash_attention_varlen(q, k, v, cu.to(dev), cu.to(dev), max(lens), max(lens),
                                     causal=True)  # fmt: skip
        assert isinstance(out, torch.Tensor)
        return _grads(out, (q, k, v))
    if kind == "sinks":  # GPT-OSS attention: one sink logit per query head
        s = (5, 17, 40)[size]
        q, k, v = _leaves(dev, g, (1, 2, s, 16), (1, 1, s, 16), (1, 1, s, 16))
        (sinks,) = _leaves(dev, g, (2,))
        out = sink_attention(q, k, v, sinks, causal=bool(seed % 2), sliding_window=4)
        assert isinstance(out, torch.Tensor)
        return _grads(out, (q, k, v, sinks))
    if kind == "add_rms_norm":
        rows, h = ((3, 8), (7, 24), (20, 40))[size]
        x, r, w = _leaves(dev, g, (rows, h), (rows, h), (h,))
        y, hs = torch.ops.nki.add_rms_norm(x, r, w, 1e-6)
        return _grads(torch.cat([y, hs], -1), (x, r, w))
    if kind in ("rms_norm", "layer_norm"):
        rows, h = ((3, 8), (7, 24), (20, 40))[size]
        x, w = _leaves(dev, g, (rows, h), (h,))
        if kind == "rms_norm":
            out = torch.ops.nki.rms_norm(x, w, 1e-6)
        else:
            out = torch.ops.nki.layer_norm(x, w, None, 1e-5)
        return _grads(out, (x, w))
    if kind == "moe_mlp":
        t = (3, 9, 20)[size]
        x, lg = _leaves(dev, g, (t, 16), (t, 4))
        wgu = (0.1 * torch.randn(4, 16, 32, generator=g)).to(dev).requires_grad_(True)
        wd = (0.1 * torch.randn(4, 16, 16, generator=g)).to(dev).requires_grad_(True)
        # sizes 0, 1: the decode mode (T <= 64, dropless); 2: the blockwise kernel (a
        # capacity factor that drops nothing)
        cf = 4.0 if size == 2 else None
        out = torch.ops.nki.moe_mlp(x, lg, wgu, wd, top_k=2, capacity_factor=cf)
        return _grads(out, (x, lg, wgu, wd))
    if kind == "moe_gated":  # GPT-OSS experts: grouped_mm + expert_act, biases, clamps
        t = (3, 9, 20)[size]
        x, w = _leaves(dev, g, (t, 16), (t, 2))
        ids = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(t)]).to(dev)
        wgu, bgu, wd, bd = _leaves(dev, g, (4, 16, 32), (4, 32), (4, 16, 16), (4, 16))
        out = moe_gated_experts(x, w, ids, wgu, wd, b_gate_up=bgu, b_down=bd,
                                activation="gpt_oss", interleaved=True, limit=1.5)  # fmt: skip
        return _grads(out, (x, w, wgu, bgu, wd, bd))
    if kind == "decode":
        s = (6, 19, 33)[size]
        q = torch.randn(2, 2, 1, 16, generator=g).to(dev)
        kc = torch.randn(2, 1, s, 16, generator=g).to(dev)
        vc = torch.randn(2, 1, s, 16, generator=g).to(dev)
        lens = torch.tensor([s, max(1, s // 2)]).to(dev)
        out = decode_attention(q, kc, vc, lens)
        assert isinstance(out, torch.Tensor)
        return [out.cpu()]
    raise ValueError(f"kind: expected one of {KINDS}; got {kind!r}")


def run_threaded(calls: Sequence[Call], threads: int) -> list[list[torch.Tensor]]:
    """Results of `calls` (in call order) made from `threads` threads at once: thread j
    makes calls j, j + threads, ..., all threads released together by a barrier."""
    results: list[list[torch.Tensor] | None] = [None] * len(calls)
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(j: int) -> None:
        try:
            start.wait()
            for i in range(j, len(calls), threads):
                results[i] = run_call(calls[i])
        except BaseException as e:  # re-raised below, in the test's thread
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(j,)) for j in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_identical(
    got: Sequence[Sequence[torch.Tensor]], want: Sequence[Sequence[torch.Tensor]],
    calls: Sequence[Call],
) -> None:  # fmt: skip
    """Bit-identical results, call by call (NaN equal to NaN in the same place)."""
    assert len(got) == len(want)
    for call, a, b in zip(calls, got, want):
        assert len(a) == len(b), call
        for i, (x, y) in enumerate(zip(a, b)):
            same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y))
            assert same, f"{call}: result {i} differs from the serial run"


def mixed_calls(n: int, devices: Sequence[str], seed: int = 0) -> list[Call]:
    """`n` calls cycling through every kind, size and device."""
    return [
        (KINDS[i % len(KINDS)], (i // len(KINDS)) % 3, seed + i, devices[(i // 3) % len(devices)])
        for i in range(n)
    ]


def serial(calls: Sequence[Call], fn: Callable[[Call], list[torch.Tensor]] = run_call) -> list:
    """Results of `calls` made one after the other in this thread."""
    return [fn(c) for c in calls]
