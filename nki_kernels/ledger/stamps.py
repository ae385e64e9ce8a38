"""What determines a priced ledger row, as a content stamp: a stale row is one whose code
changed after it was priced.

A ledger row's figure is a function of the cost model (its version is in the row's key),
the code that builds the priced work (our kernel and its pricing helper, or the native
composition), and, for our kernels, the shipped configs the op looks up. Each component
kind names those determinants (`DETERMINANTS`); its stamp is a hash over:

- `kernel_source_hash` of each named function (the scheme shipped configs use for their
  `kernel_hash`: the function's module and the modules of its package it takes names
  from, so a kernel's helpers and heuristics count); "module M": M's own source alone;
- each shipped config file of the op on the row's target, its entries' configs and their
  kernel hashes only (a re-priced latency in an entry's provenance changes no figure).

`stamp(what, impl, target)` returns the hash with its parts; a row stores both, so a
stale row can say which part changed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
from typing import Any

from ..runtime.kernel_cache import kernel_source_hash

# (what, impl) -> (dotted functions, shipped config ops)
COMPOSITION = ("nki_kernels.baselines.native.price", "nki_kernels.baselines.steps.matmul_step")
NATIVE_ATTENTION = (
    *COMPOSITION,
    "nki_kernels.baselines.native.attention_fwd",
    "module nki_kernels.ledger.mla",
)
DETERMINANTS: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {
    ("matmul", "compiler"): (COMPOSITION, ()),
    ("swiglu", "compiler"): (COMPOSITION, ()),
    ("norm", "native"): (
        (*COMPOSITION, "nki_kernels.baselines.native.rms_norm_fwd"),
        (),
    ),
    ("norm", "ours"): (
        (
            "nki_kernels.norm.bench.op_parts",
            "nki_kernels.norm.rmsnorm.rms_norm_fwd",
            "nki_kernels.norm.rmsnorm.add_rms_norm_fwd",
            "nki_kernels.norm.rmsnorm_bwd.rms_norm_bwd",
        ),
        ("rms_norm", "add_rms_norm", "rms_norm_bwd"),
    ),
    ("attention", "native"): (
        NATIVE_ATTENTION,
        (),
    ),
    ("attention", "ours"): (
        (
            "nki_kernels.attention.bench.price",
            "nki_kernels.attention.flash_fwd.flash_attention_fwd",
            "nki_kernels.attention.flash_bwd.flash_attention_bwd",
        ),
        ("flash_attention",),
    ),
    ("decode attention", "native"): (
        NATIVE_ATTENTION,
        (),
    ),
    ("decode attention", "ours"): (
        (
            "nki_kernels.attention.decode_host.stream_kernel_args",
            "nki_kernels.attention.decode_stream.decode_stream_fwd",
        ),
        ("decode_attention",),
    ),
    ("moe", "ours"): (
        (
            "nki_kernels.moe.pricing.layer_row",
            "nki_kernels.moe.blockwise_mlp.moe_mlp_fwd",
            "nki_kernels.moe.blockwise_mlp_bwd.moe_mlp_bwd",
            "nki_kernels.moe.router.moe_router_fwd",
            "nki_kernels.moe.router.moe_router_bwd",
        ),
        ("moe_mlp",),
    ),
    ("moe decode", "ours"): (
        (
            "module nki_kernels.moe.decode_pricing",
            "nki_kernels.moe.decode_mlp.moe_decode_fwd",
            "nki_kernels.moe.router.moe_router_fwd",
        ),
        (),
    ),
    ("moe decode", "native"): (
        (
            *COMPOSITION,
            "nki_kernels.baselines.moe_native.blockwise_fwd",
            "nki_kernels.baselines.moe_native.grouped_mm_fwd",
            "module nki_kernels.ledger.native_moe_decode",
        ),
        (),
    ),
    ("moe", "native"): (
        (
            *COMPOSITION,
            "nki_kernels.baselines.moe_native.blockwise_fwd",
            "nki_kernels.baselines.moe_native.grouped_mm_fwd",
            "module nki_kernels.ledger.native_moe",
        ),
        (),
    ),
}


def _resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


@functools.cache
def _function_hash(dotted: str) -> str:
    if dotted.startswith("module "):  # this module's own source, not its package's
        module = importlib.import_module(dotted.removeprefix("module "))
        return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()[:16]
    return kernel_source_hash(_resolve(dotted))


def _config_hash(op: str, target: str) -> str:
    """The shipped entries of `op` on `target`: configs and kernel hashes, not latencies."""
    from ..runtime.config_store import SHIPPED_DIR

    path = SHIPPED_DIR / target / f"{op}.json"
    if not path.exists():
        return "absent"
    entries = json.loads(path.read_text()).get("entries", {})
    kept = {
        k: [e.get("config"), (e.get("provenance") or {}).get("kernel_hash")]
        for k, e in sorted(entries.items())
    }
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def stamp_parts(what: str, impl: str, target: str) -> dict[str, str]:
    """Each determinant of a `what` row priced for `impl` on `target`, with its hash."""
    if (what, impl) not in DETERMINANTS:
        raise ValueError(f"ledger stamp: no determinants for ({what!r}, {impl!r})")
    functions, configs = DETERMINANTS[(what, impl)]
    parts = {f: _function_hash(f) for f in functions}
    parts |= {f"configs {target}/{op}": _config_hash(op, target) for op in configs}
    return parts


@functools.cache
def _stamp(what: str, impl: str, target: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    parts = stamp_parts(what, impl, target)
    text = json.dumps(sorted(parts.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16], tuple(sorted(parts.items()))


def stamp(what: str, impl: str, target: str) -> tuple[str, dict[str, str]]:
    """(the stamp, its parts) of a row of this component kind."""
    s, parts = _stamp(what, impl, target)
    return s, dict(parts)


def changed(row_parts: dict[str, str] | None, now: dict[str, str]) -> list[str]:
    """The determinants whose hash differs from the row's (all of them for an unstamped
    row), as short names."""
    if not row_parts:
        return ["unstamped (priced before rows were stamped)"]
    out = [k for k, v in now.items() if row_parts.get(k) != v]
    return [k.removeprefix("nki_kernels.") for k in out] or ["its determinants"]


def clear() -> None:
    """Forget the memoized stamps (tests that change a determinant)."""
    _stamp.cache_clear()
    _function_hash.cache_clear()
