"""Fit one parameter set per target: bounded least squares in log ratio, no per-kernel factor.

The residual of a measurement is log(modeled / measured); the fitter minimizes their sum
of squares over the target parameters named in `FIT_PARAMETERS`, each kept inside its
documented (or, tagged L, assumed) range. Parameters are searched in normalized
coordinates u = (x - lo) / (hi - lo) in [0, 1] by a compass search (each coordinate
up and down by a step that halves when nothing improves); a weak pull (`PRIOR_WEIGHT`)
towards the documented value keeps a parameter that no measurement constrains where the
documents put it (instead of wandering inside its range).

`fit(residuals, base, names)` is generic: `residuals(target) -> {id: log ratio}` comes
from `AnchorSet.log_errors` (published anchors) or from `calibrate` (measured rows).
`leave_one_out` refits without each measurement in turn; the resulting parameter sets
are what `perfmodel.band` prices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..targets import Target

Residuals = Callable[[Target], Mapping[str, float]]

# (parameter, lower, upper, documented value = the prior, where these come from).
Range = tuple[str, float, float, float, str]
_DMA_FLOOR: Range = ("dma_descriptor_min_ns", 20.0, 100.0, 100.0, "<= ~100 ns (HARDWARE.md, L)")
_DMA_FIXED: Range = (
    "dma_fixed_ns",
    0.0,
    1950.0,
    1300.0,
    "'~1300 ns cross-engine' semaphore-to-start (dma bandwidth guide); no documented lower "
    "bound (range L)",
)
_DEP: Range = (
    "dependent_instr_cycles",
    60.0,
    200.0,
    100.0,
    "~100 cycles 'in the order of' (perf guide)",
)
_TRANSPOSE: Range = (
    "dma_transpose_hbm_efficiency",
    0.37,
    0.9,
    0.5,
    "'up to 90 %' (trainium2_arch); 0.37-0.5 fits AWS's measured attention_cte (issue 11)",
)
_TRANSPOSE_SBUF: Range = (
    "dma_transpose_sbuf_efficiency",
    0.2,
    0.5,
    0.5,
    "'up to 50 %' SBUF -> SBUF (trainium2_arch); no documented lower bound (range L)",
)
_MATMUL_EXTRA: Range = (
    "matmul_extra_cycles",
    0.0,
    32.0,
    0.0,
    "TensorE cycles per instruction beyond 'roughly max(N, MM_INIT_LATENCY)' (trainium arch "
    "guide): none documented (range L)",
)
_SEMAPHORE: Range = (
    "semaphore_ns",
    0.0,
    200.0,
    50.0,
    "cross-engine semaphore latency: not documented (assumed 50 ns; range L)",
)
_PSUM_2X: Range = (
    "vector_bf16_2x_speedup",
    1.0,
    2.0,
    2.0,
    "VectorE 2x mode ('could see a 2x throughput lift', trainium2_arch): 1 = never engaged",
)
_TILE_OVERLAP: Range = (
    "tensor_tile_overlap",
    0.0,
    1.0,
    1.0,
    "TensorE tiling mode: tiled nc_matmuls on disjoint PE tiles 'run in parallel' (nc_matmul "
    "ISA page; no cost given): 0 = no overlap",
)
_SCAN: Range = (
    "scan_cycles_per_element",
    1.0,
    2.0,
    2.0,
    "tensor_tensor_scan: no documented cost; one element per cycle .. the two-input 2N rule "
    "of thumb (trainium arch guide) (L)",
)


def _rate(upper: float, lower: float) -> Range:
    return (
        "dma_engine_bytes_per_ns",
        lower,
        upper,
        upper,
        f"<= {upper:g} B/ns per engine (dma bandwidth guide)",
    )


FIT_PARAMETERS: dict[str, tuple[Range, ...]] = {
    "trn1": (_rate(17.0, 4.0), _DMA_FLOOR, _DMA_FIXED, _DEP, _SCAN),
    "trn2": (
        _rate(23.0, 15.0),
        _DMA_FLOOR,
        _DMA_FIXED,
        _TRANSPOSE,
        _TRANSPOSE_SBUF,
        _MATMUL_EXTRA,
    ),
    # no published trn3 anchor: used only by `calibrate` with a user's trn3 measurements
    "trn3": (_rate(33.0, 20.0), _DMA_FLOOR, _DMA_FIXED, _TRANSPOSE),
}
# Parameters no anchor of the target constrains: the band spans their whole range. The
# sign says which end is slower (+1: a larger value makes kernels slower). On trn2/trn3
# the dependent-instruction cycles and the scan cost are trn1's fitted values, carried over.
UNANCHORED: dict[str, tuple[tuple[Range, int], ...]] = {
    "trn1": (),
    "trn2": ((_DEP, 1), (_SCAN, 1), (_SEMAPHORE, 1), (_PSUM_2X, -1), (_TILE_OVERLAP, -1)),
    "trn3": ((_DEP, 1), (_SCAN, 1), (_SEMAPHORE, 1), (_PSUM_2X, -1), (_TILE_OVERLAP, -1)),
}
# A leave-one-out set whose own left-out anchor it misprices by more than this is not a
# plausible parameter set: it is dropped from the band (v3).
LOO_DROP_PCT = 25.0
# The compiler's scheduling window (`Target.scheduling_window`, an integer the docs do not
# give) is chosen by the fit from these values: the one with the least squared log error
# at the other parameters (`anchor_fit.refit`), then the continuous fit at that window.
# trn2's only kernel anchor was measured with scheduling off, so only trn1 has one.
SCHEDULING_WINDOWS: dict[str, tuple[int, ...]] = {"trn1": (1, 2, 4, 8, 12, 16)}
PRIOR_WEIGHT = 0.02
MAX_ITERATIONS = 9  # compass-step halvings: 0.25 -> 0.001


_PRIMES = (2, 3, 5, 7, 11, 13)


def _halton(i: int, base: int) -> float:
    """The i-th point of the van der Corput sequence in `base` (a low-discrepancy sample)."""
    f, r = 1.0, 0.0
    while i:
        f /= base
        r += f * (i % base)
        i //= base
    return r


@dataclass(frozen=True)
class FitResult:
    """The fitted parameters, the final residuals (log ratios) and the cost."""

    params: dict[str, float]
    residuals: dict[str, float]
    cost: float
    iterations: int
    evaluations: int


def fit(
    residuals: Residuals,
    base: Target,
    ranges: Sequence[Range],
    start: Mapping[str, float] | None = None,
    max_iterations: int = MAX_ITERATIONS,
    prior: Mapping[str, float] | None = None,
    step: float = 0.25,
    grid: bool = True,
) -> FitResult:
    """Minimize sum(log ratio^2) + prior pull over `ranges` (see the module docstring).

    `start` defaults to the parameters' values in `base`, `prior` to the documented
    values of `ranges` (both clipped into range). `step` is the first compass step in
    normalized coordinates; the search stops when it falls below 1e-3 or after
    `max_iterations` halvings. With `grid`, the search starts from the best point of a
    coarse grid over the whole box (7 levels per parameter for up to two parameters, 16
    Halton points beyond) when that beats `start`, so a local dip near `start` does not
    trap it.
    """
    names = [r[0] for r in ranges]
    lo = [r[1] for r in ranges]
    hi = [r[2] for r in ranges]
    for name, a, b in zip(names, lo, hi):
        if not a < b:
            raise ValueError(f"ranges: {name} needs lower < upper; got {a}, {b}")

    def to_u(vals: Mapping[str, float]) -> list[float]:
        return [min(1.0, max(0.0, (vals[n] - a) / (b - a))) for n, a, b in zip(names, lo, hi)]

    def to_x(u: Sequence[float]) -> dict[str, float]:
        return {n: a + ui * (b - a) for n, ui, a, b in zip(names, u, lo, hi)}

    u0 = to_u(prior or {r[0]: r[3] for r in ranges})
    u = to_u(start or {n: float(getattr(base, n)) for n in names})
    evals = 0

    def cost_of(uv: Sequence[float]) -> tuple[float, dict[str, float]]:
        nonlocal evals
        evals += 1
        r = dict(residuals(base.replace(**to_x(uv))))
        c = sum(x * x for x in r.values())
        c += sum((PRIOR_WEIGHT * (ui - pi)) ** 2 for ui, pi in zip(uv, u0))
        return c, r

    cost, r_cur = cost_of(u)
    if grid:
        levels = 7 if len(u) <= 2 else 3
        pts: list[list[float]] = [[]]
        if len(u) <= 2:
            for _ in u:
                pts = [[*p, k / (levels - 1)] for p in pts for k in range(levels)]
        else:  # a full grid would cost 3^d schedules: 16 Halton points instead
            pts = [[_halton(i, b) for b in _PRIMES[: len(u)]] for i in range(1, 17)]
        for cand in pts:
            c, r = cost_of(cand)
            if c < cost:
                u, cost, r_cur = cand, c, r
        step = min(step, 0.5 / (levels - 1))
    it = 0
    # Compass (pattern) search: the modeled latency is piecewise smooth in the DMA
    # parameters (schedules change discretely), which defeats derivative-based steps.
    while step >= 1e-3 and it < max_iterations:
        it += 1
        moved = True
        while moved:
            moved = False
            for j in range(len(u)):
                for sign in (1.0, -1.0):
                    cand = list(u)
                    cand[j] = min(1.0, max(0.0, u[j] + sign * step))
                    if cand[j] == u[j]:
                        continue
                    c, r = cost_of(cand)
                    if c < cost - 1e-12:
                        u, cost, r_cur, moved = cand, c, r, True
                        break
        step /= 2.0
    return FitResult(to_x(u), r_cur, cost, it, evals)


def leave_one_out(
    residuals: Residuals,
    ids: Sequence[str],
    base: Target,
    ranges: Sequence[Range],
    start: Mapping[str, float] | None = None,
    max_iterations: int = 6,
    step: float = 0.125,
) -> dict[str, FitResult]:
    """For each id: the fit without it; its residual (in `.residuals`) is its prediction."""
    out = {}
    for left in ids:

        def without(t: Target, left: str = left) -> dict[str, float]:
            return {k: v for k, v in residuals(t).items() if k != left}

        res = fit(
            without,
            base,
            ranges,
            start=start,
            max_iterations=max_iterations,
            step=step,
            grid=False,
        )
        full = dict(residuals(base.replace(**res.params)))
        out[left] = FitResult(res.params, full, res.cost, res.iterations, res.evaluations + 1)
    return out


def pct(log_ratio: float) -> float:
    """A log ratio as a signed percentage error (modeled vs measured)."""
    return 100.0 * (math.exp(log_ratio) - 1.0)
