"""Latency bands of benchmark rows: every row re-priced under each of the cost model's
parameter sets (`perfmodel.band.parameter_sets`, cost model v2 and later), and the bands
of ratios between rows.

A row's latency is some sum or extrapolation of the latencies of the traces its pricing
produced. Rather than re-deriving that arithmetic per family, the whole pricing function
is run once per parameter set with the interpreter's traces replayed from the first run
(the trace does not depend on the cost parameters, only on the kernel, its arguments and
the target's limits), so each extra set costs scheduling only. The band is the minimum
and maximum over the sets (the shipped set included), widened by the model's
cross-validated error (v3, `perfmodel.band.widen`); `extra['samples_us']` keeps the
per-set latencies so a speedup's band pairs the same set on both sides (`ratio_band`,
widened by the error of two figures). It is the range over the sets the anchors allow
plus that structural term, not a confidence interval (see the cost model section).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from ..targets import Target, get_target
from .rows import BenchRow


def latency_band(samples: Sequence[float], target: str | Target) -> tuple[float, float]:
    """A row's latency band from its per-set samples: min and max, widened by the
    structural error (no widening when the cost model has no bands)."""
    lo, hi = min(samples), max(samples)
    try:
        from ..perfmodel.band import widen
    except ImportError:
        return lo, hi
    return widen(lo, hi, target)


def ratio_band(
    ours: Sequence[float],
    other: Sequence[float],
    target: str | Target,
    provenance: str | None = None,
) -> tuple[float, float]:
    """The band of other / ours: the ratio per parameter set (the same set on both sides),
    min and max, widened by the structural error of two figures (`widen_ratio`)."""
    ratios = [y / x for x, y in zip(ours, other, strict=True)]
    return widen_ratio(min(ratios), max(ratios), target, provenance)


def widen_ratio(
    lo: float, hi: float, target: str | Target, provenance: str | None = None
) -> tuple[float, float]:
    """A ratio's band (lo, hi) over the parameter sets, widened by the structural error of
    two modeled figures (`perfmodel.band.widen`, terms = 2). Rows priced by an older cost
    model (`provenance` naming another version) keep their own band: the structural term
    is the current model's."""
    try:
        from ..perfmodel import COST_MODEL_VERSION
        from ..perfmodel.band import widen
    except ImportError:
        return lo, hi
    if provenance is not None and f"cost model {COST_MODEL_VERSION}" not in provenance:
        return lo, hi
    return widen(lo, hi, target, terms=2)


def ceiling_label(
    text: str, op: str, mfu: float | None = None, hbm_fraction: float | None = None
) -> str:
    """`text` + ' ceiling' when the modeled MFU (or bandwidth fraction) of `op` is above
    the best published measurement of its kind (`perfmodel.ceiling`, the one place that
    decides); tables, plots and the README headline all go through here."""
    try:
        from ..perfmodel.ceiling import label
    except ImportError:
        return text
    return label(text, op, mfu, hbm_fraction)


def parameter_sets(target: str | Target) -> list[Target]:
    """The shipped target followed by the sets its band spans ([target] alone when the
    cost model has no bands)."""
    try:
        from ..perfmodel.band import parameter_sets as sets
    except ImportError:
        return [get_target(target)]
    return list(sets(target))


@contextlib.contextmanager
def replayed_traces() -> Iterator[None]:
    """Within the block, a trace-only interpretation seen before is not run again: the
    recorded result is returned (keyed by kernel, arguments, target name and LNC)."""
    from ..perfmodel import api
    from ..perfmodel.compiled import reuse_compiled

    real = api.run
    seen: dict[str, Any] = {}

    def run(kernel: Any, *args: Any, target: Any = None, lnc: int = 1, **kwargs: Any) -> Any:
        name = getattr(target, "name", target)
        key = repr((id(kernel), args, sorted(kwargs.items(), key=lambda kv: kv[0]), name, lnc))
        if key not in seen:
            seen[key] = real(kernel, *args, target=target, lnc=lnc, **kwargs)
        return seen[key]

    api.run = run  # type: ignore[assignment]
    try:
        with reuse_compiled():  # a replayed trace is scheduled on its compiled form
            yield
    finally:
        api.run = real  # type: ignore[assignment]


def with_bands(price: Callable[[Target], list[BenchRow]], target: str) -> list[BenchRow]:
    """`price(target)` for the shipped target, each row with its band over the sets."""
    sets = parameter_sets(target)
    with replayed_traces():
        base = price(sets[0])
        if len(sets) == 1:
            return base
        runs = [base] + [price(s) for s in sets[1:]]
    out = []
    for i, row in enumerate(base):
        samples = [run[i].latency_us for run in runs]
        if any(run[i].op != row.op or run[i].case != row.case for run in runs):
            raise RuntimeError(f"band: the rows of {row.op} {row.case} changed order across sets")
        out.append(
            replace(
                row,
                band_us=latency_band(samples, target),
                extra={**row.extra, "samples_us": samples},
            )
        )
    return out
