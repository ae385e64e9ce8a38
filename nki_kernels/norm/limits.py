"""The largest hidden size each norm op runs, per dtype, affine parameters and target.

A norm kernel keeps the broadcast weight (and bias) rows resident in SBUF, [128, H] per
parameter (every partition normalizes its own rows), while x streams in column chunks;
the backward also keeps its per-column sums in one PSUM bank (H <= 65536). So the
hidden-size limit is set by SBUF: the largest H for which the op's heuristic plan (or,
for the backward, the backward plan and the statistics plan it may need) fits. It is
found by bisection over the configs' own validity checks, so it is exactly the boundary
at which the op would otherwise fail deep inside the config lookup.

Tuned configs never extend it: they are checked with the same SBUF rules.
"""

from __future__ import annotations

import functools

from ..kernel_config import InvalidConfig
from ..targets import get_target
from .config import (
    AddRMSNormBwdConfig,
    AddRMSNormConfig,
    LayerNormBwdConfig,
    LayerNormConfig,
    NormProblem,
    RMSNormBwdConfig,
    RMSNormConfig,
    _NormConfig,
    stats_in_kernel,
)
from .tiling import COLSUM_MAX_H

SEARCH_MAX_H = 1 << 20  # forward without parameters: streamed, checked up to this size
PROBE_ROWS = 128  # row count of the probe problem (one row tile; plans fall back to 1 row)

_FORWARD: dict[str, type[_NormConfig]] = {
    "rms_norm": RMSNormConfig,
    "add_rms_norm": AddRMSNormConfig,
    "layer_norm": LayerNormConfig,
}
_BACKWARD: dict[str, tuple[type[_NormConfig], type[_NormConfig]]] = {
    "rms_norm": (RMSNormBwdConfig, RMSNormConfig),
    "add_rms_norm": (AddRMSNormBwdConfig, RMSNormConfig),
    "layer_norm": (LayerNormBwdConfig, LayerNormConfig),
}


def _fits(op: str, backward: bool, hidden: int, dtype: str, affine: str, target: str) -> bool:
    problem = NormProblem(rows=PROBE_ROWS, hidden=hidden, dtype=dtype, affine=affine)
    tgt = get_target(target)
    try:
        if not backward:
            _FORWARD[op].heuristic(problem, tgt)
            return True
        bwd_cls, stats_cls = _BACKWARD[op]
        cfg = bwd_cls.heuristic(problem, tgt)
        if not stats_in_kernel(cfg):
            stats_cls.heuristic(problem, tgt)
        return True
    except InvalidConfig:
        return False


@functools.cache
def max_hidden(op: str, backward: bool, dtype: str, affine: str, target: str) -> int:
    """Largest H that `op` ("rms_norm", "add_rms_norm", "layer_norm") runs forward or
    backward at `dtype` ("float32", ...) with `affine` ("none", "w", "b", "wb") on
    `target` (a target name); 0 if none."""
    top = COLSUM_MAX_H if backward else SEARCH_MAX_H
    if _fits(op, backward, top, dtype, affine, target):
        return top
    lo, hi = 0, top  # fits(lo) (or lo = 0), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(op, backward, mid, dtype, affine, target):
            lo = mid
        else:
            hi = mid
    return lo


__all__ = ["SEARCH_MAX_H", "max_hidden"]
