"""The "nki" attention function's fallback counts stay exact when models run on several
threads (servers, data loaders), and each thread gets the serial result."""

from __future__ import annotations

import collections
import threading
import time

import torch

from nki_kernels.integrations import hf_attention
from nki_kernels.ops.attention import HEAD_DIM_MAX


class _SlowCounter(collections.Counter):
    """A Counter whose reads yield the GIL before returning: an unlocked `c[k] += 1`
    from two threads then loses updates on almost every call, instead of rarely."""

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        value = super().__getitem__(key)
        time.sleep(1e-5)
        return value


def test_fallback_counts_are_exact_and_outputs_serial_under_threads(monkeypatch) -> None:
    monkeypatch.setattr(hf_attention, "_FALLBACKS", _SlowCounter())
    d = HEAD_DIM_MAX + 8  # past the op's head_dim: the torch SDPA fallback, counted
    g = torch.Generator().manual_seed(0)
    inputs = [tuple(torch.randn(1, 2, 3, d, generator=g) for _ in range(3)) for _ in range(4)]

    def call(i: int) -> torch.Tensor:
        q, k, v = inputs[i]
        return hf_attention.nki_attention_forward(torch.nn.Module(), q, k, v, None)[0]

    want = [call(i) for i in range(len(inputs))]
    hf_attention._FALLBACKS.clear()
    threads, per_thread = 6, 20
    start = threading.Barrier(threads)
    got: dict[tuple[int, int], torch.Tensor] = {}

    def work(t: int) -> None:
        start.wait()
        for n in range(per_thread):
            got[t, n] = call((t + n) % len(inputs))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert hf_attention.fallbacks() == {f"head_dim {d} > {HEAD_DIM_MAX}": threads * per_thread}
    for (t, n), out in got.items():
        assert torch.equal(out, want[(t + n) % len(inputs)]), (t, n)
