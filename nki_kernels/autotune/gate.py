"""Correctness gate: a config's time counts only if its output is right.

Before a measured config can become a study's result it runs in numeric mode on a reduced
problem of the same bucket family (the op's `Tunable.reduced`, which keeps every tile size
of the config in play and a ragged edge where the family has one) and its outputs are
compared with the op's reference: `|out - ref| <= atol + rtol * |ref|` elementwise, no
NaN / Inf where the reference is finite, identical shapes. A config that is fast and wrong
is rejected with the worst element in the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernel_config import KernelConfig
from ..targets import Target
from .tunable import Tunable


@dataclass(frozen=True)
class GateResult:
    """Outcome of one correctness check."""

    ok: bool
    reason: str  # "" when ok
    max_abs_err: float
    problem: str  # the reduced problem that was run


Tol = tuple[float, float]


def compare(outputs: Any, references: Any, tol: Tol | Sequence[Tol]) -> tuple[bool, str, float]:
    """Compare kernel outputs with references; return (ok, reason, max abs error).

    `tol` is one (atol, rtol) for every output, or one pair per output.
    """
    outs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    refs = list(references) if isinstance(references, list | tuple) else [references]
    if len(outs) != len(refs):
        return False, f"kernel returned {len(outs)} output(s), reference {len(refs)}", np.inf
    if len(tol) == 2 and all(isinstance(v, int | float) for v in tol):
        tols: list[Any] = [tuple(tol)] * len(outs)
    else:
        tols = list(tol)
    if len(tols) < len(outs):
        raise ValueError(f"tol: expected {len(outs)} (atol, rtol) pairs; got {len(tols)}")
    worst = 0.0
    for i, (o, r) in enumerate(zip(outs, refs)):
        atol, rtol = tols[i]
        o = np.asarray(o, dtype=np.float64)
        r = np.asarray(r, dtype=np.float64)
        if o.shape != r.shape:
            return False, f"output {i}: shape {o.shape} differs from reference {r.shape}", np.inf
        bad_nonfinite = ~np.isfinite(o) & np.isfinite(r)
        if bad_nonfinite.any():
            idx = tuple(int(x) for x in np.argwhere(bad_nonfinite)[0])
            return False, f"output {i}: non-finite value {o[idx]} at {idx} (ref {r[idx]})", np.inf
        # cells whose reference is not finite (e.g. -inf lse of an empty attention row)
        # carry no requirement: the op defines those rows itself
        finite = np.isfinite(r)
        with np.errstate(invalid="ignore"):
            err = np.where(finite, np.abs(o - r), 0.0)
        if err.size:
            worst = max(worst, float(err.max()))
        over = err > atol + rtol * np.abs(np.where(finite, r, 0.0))
        if over.any():
            idx = tuple(int(x) for x in np.argwhere(over)[0])
            n_bad = int(over.sum())
            return (
                False,
                f"output {i}: {n_bad} of {over.size} elements outside atol={atol:g}, "
                f"rtol={rtol:g}; first at {idx}: got {o[idx]:.6g}, reference {r[idx]:.6g}",
                worst,
            )
    return True, "", worst


class CorrectnessGate:
    """Runs configs numerically on a reduced problem and checks them against the reference.

    Results are memoized per (op, target, config, reduced problem) within the process.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._cache: dict[tuple[str, str, str, str], GateResult] = {}

    def check(
        self, tunable: Tunable, problem: Any, config: KernelConfig, target: Target
    ) -> GateResult:
        """Check `config`; interpreter rule errors on the reduced problem propagate."""
        reduced = tunable.reduced(problem, config, target)
        desc = tunable.describe(reduced)
        key = (tunable.op, target.name, config.key(), f"{desc} lnc={tunable.lnc}")
        if key in self._cache:
            return self._cache[key]
        outputs, refs = tunable.run_numeric(reduced, config, target, self.seed)
        ok, reason, worst = compare(outputs, refs, tunable.tolerance(reduced))
        result = GateResult(ok, reason, worst, desc)
        self._cache[key] = result
        return result
