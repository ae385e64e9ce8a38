"""Shared helpers for the interpreter tests.

`run_tiles(body, inputs, outs)` launches a kernel that loads each input array into an
SBUF tile, allocates fresh SBUF tiles for `outs` ((shape, dtype) pairs, so they start
NaN / sentinel-filled), calls `body(*in_tiles, *out_tiles)` and stores the out tiles.
`expect_rule(rule, fn, ...)` asserts that a call fails with the named rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from nki_kernels.interp import NkiValidationError, nl, run
from nki_kernels.interp.launch import RunResult

BF16 = np.dtype(ml_dtypes.bfloat16)


def run_tiles(
    body: Callable[..., Any],
    inputs: list[np.ndarray],
    outs: list[tuple[tuple[int, ...], Any]],
    *,
    target: str = "trn2",
    trace_only: bool = False,
) -> RunResult:
    def kernel(*hbm: Any) -> Any:
        tiles = [nl.load(h) for h in hbm]
        out_tiles = [nl.ndarray(s, d, buffer=nl.sbuf) for s, d in outs]
        body(*tiles, *out_tiles)
        results = []
        for t in out_tiles:
            o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
            nl.store(o, t)
            results.append(o)
        return tuple(results)

    return run(kernel, *inputs, target=target, trace_only=trace_only)


def outputs(body: Callable[..., Any], inputs: list[np.ndarray], outs: list[Any], **kw: Any) -> Any:
    """The output arrays of `run_tiles` (a single array when there is one output)."""
    res = run_tiles(body, inputs, outs, **kw).outputs
    return res[0] if len(res) == 1 else res


def last_instr(result: RunResult, opcode: str) -> Any:
    """The last trace record with `opcode`."""
    found = [i for i in result.trace if i.opcode == opcode]
    assert found, f"no {opcode} record in the trace"
    return found[-1]


def bf16(x: np.ndarray) -> np.ndarray:
    """Round fp32 values to bf16 (what a bf16 destination stores)."""
    return np.asarray(x, dtype=np.float32).astype(BF16)


def expect_rule(rule: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NkiValidationError:
    """Call `fn(*args, **kwargs)`; assert it raises the interpreter error of `rule`, whose
    message names the rule."""
    with pytest.raises(NkiValidationError) as e:
        fn(*args, **kwargs)
    assert e.value.rule == rule, str(e.value)
    assert str(e.value).endswith(f"(rule {rule})"), str(e.value)
    return e.value
