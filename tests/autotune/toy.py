"""A small tunable kernel for the autotuner's tests: out = x * 3 + 1, tiled.

Config fields and what each exercises in the tuner:
- `tile_cols`: free-dim tile width (the main trade-off of the toy price below);
- `bufs`: SBUF tiles kept live at once (each group of `bufs` tiles is loaded before any is
  computed). `validate` does not check SBUF capacity, so wide tiles times many buffers
  overflow SBUF in the interpreter (rule SBUF_OVERFLOW);
- `skip_tail`: drops the ragged last column tile -- less work (fast) and wrong whenever
  the column count is not a multiple of `tile_cols` (the correctness gate must catch it);
- `tile_cols` wider than the problem is rejected by `validate` (InvalidConfig).

The toy price is a deterministic stand-in for the cost model: a fixed cost per
instruction plus bytes over a bandwidth, with a small per-live-buffer SBUF penalty.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from nki_kernels.autotune.measure import TraceMeasurer
from nki_kernels.autotune.tunable import Tunable
from nki_kernels.interp.launch import TensorSpec, run
from nki_kernels.interp.trace import Trace
from nki_kernels.kernel_config import InvalidConfig, KernelConfig
from nki_kernels.nki import nisa, nki, nl
from nki_kernels.targets import Target


@dataclass(frozen=True)
class ToyProblem:
    rows: int
    cols: int
    dtype: str = "float32"


@nki.jit
def toy_kernel(x, tile_cols, bufs, skip_tail):
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    tiles = [nl.ndarray((128, tile_cols), dtype=x.dtype, buffer=nl.sbuf) for _ in range(bufs)]
    n_col_tiles = cols // tile_cols if skip_tail else (cols + tile_cols - 1) // tile_cols
    spans = [
        (r0, min(128, rows - r0), j * tile_cols, min(tile_cols, cols - j * tile_cols))
        for r0 in range(0, rows, 128)
        for j in range(n_col_tiles)
    ]
    # `bufs` loads in flight: a group's tiles are all loaded before any is computed
    for g0 in range(0, len(spans), bufs):
        group = spans[g0 : g0 + bufs]
        for b, (r0, nr, c0, nc) in enumerate(group):
            nisa.dma_copy(dst=tiles[b][0:nr, 0:nc], src=x[r0 : r0 + nr, c0 : c0 + nc])
        for b, (r0, nr, c0, nc) in enumerate(group):
            t = tiles[b][0:nr, 0:nc]
            nisa.tensor_scalar(
                dst=t, data=t, op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=1.0
            )
            nisa.dma_copy(dst=out[r0 : r0 + nr, c0 : c0 + nc], src=t)
    if skip_tail and cols % tile_cols:
        pass  # the ragged tail is (wrongly) never written
    return out


@dataclass(frozen=True)
class ToyConfig(KernelConfig):
    op_name: ClassVar[str] = "toy_scale"
    tile_cols: int = 512
    bufs: int = 2
    skip_tail: bool = False

    @classmethod
    def heuristic(cls, problem: Any, target: Target) -> ToyConfig:
        return cls(tile_cols=min(512, problem.cols), bufs=2, skip_tail=False)

    @classmethod
    def search_space(cls, problem: Any, target: Target) -> dict[str, tuple[Any, ...]]:
        return {
            "tile_cols": (128, 256, 512, 1024, 2048, 4096, 8192),
            "bufs": (1, 2, 4, 8),
            "skip_tail": (False, True),
        }

    def validate(self, problem: Any, target: Target) -> None:
        if self.tile_cols > max(128, problem.cols):
            raise InvalidConfig(f"tile_cols {self.tile_cols} > cols {problem.cols}")


def toy_trace(problem: ToyProblem, config: KernelConfig, target: Target) -> Trace:
    assert isinstance(config, ToyConfig)
    spec = TensorSpec((problem.rows, problem.cols), problem.dtype)
    res = run(
        toy_kernel, spec, config.tile_cols, config.bufs, config.skip_tail,
        target=target, trace_only=True,
    )  # fmt: skip
    return res.trace


def toy_reduced(problem: ToyProblem, config: KernelConfig, target: Target) -> ToyProblem:
    assert isinstance(config, ToyConfig)
    # two and a bit column tiles, two row tiles with a ragged second one
    return ToyProblem(rows=130, cols=2 * config.tile_cols + 3, dtype=problem.dtype)


def toy_numeric(
    problem: ToyProblem, config: KernelConfig, target: Target, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    assert isinstance(config, ToyConfig)
    x = np.random.default_rng(seed).standard_normal((problem.rows, problem.cols))
    x = x.astype(np.float32)
    res = run(toy_kernel, x, config.tile_cols, config.bufs, config.skip_tail, target=target)
    return [res.outputs], [x.astype(np.float64) * 3 + 1]


def make_toy(op: str = "toy_scale") -> Tunable:
    return Tunable(
        op=op,
        config_cls=ToyConfig,
        trace=toy_trace,
        reduced=toy_reduced,
        run_numeric=toy_numeric,
        tolerance=lambda p: (1e-5, 1e-6),
        bucket_key=lambda p: f"{p.rows}x{p.cols}",
        dtype=lambda p: p.dtype,
        kernels=(toy_kernel,),
    )


def toy_price(trace: Trace, target: Target) -> tuple[float, dict[str, Any]]:
    total = 0.0
    for ins in trace:
        fixed = 2000.0 if ins.engine == "dma" else 60.0
        total += fixed + ins.nbytes / 200.0
    live = max(trace.peak_sbuf_bytes)
    total += live / 64.0
    return total, {"instructions": len(trace)}


class ToyMeasurer(TraceMeasurer):
    """The toy price, optionally sleeping per measurement (to make trials overlap)."""

    def __init__(self, sleep_s: float = 0.0) -> None:
        super().__init__(toy_price, "toy-price v1")
        self.sleep_s = sleep_s
        self.calls = 0

    def measure(self, tunable, problem, config, target):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return super().measure(tunable, problem, config, target)
