"""Where the ledger's Trainium figures come from: committed rows, then a cache, then pricing.

Three sources, in this order, each figure saying which it came from:

1. the op-level benchmark rows (`benchmarks/data/bench_rows.jsonl`: ours and native;
   `peer_rows.jsonl`: AWS's kernels; `decode_aws_rows.json`), used where the case is
   exactly one of theirs and their cost-model version is the current one;
2. ledger rows priced before: the committed `benchmarks/data/ledger_rows.jsonl` and the
   user's cache (default `~/.cache/nki-kernels/ledger_rows.jsonl`), keyed by the
   component, target, LNC and cost-model version;
3. priced now (trace-only interpretation + cost model, seconds per component) and
   appended to the cache.

A row of another cost-model version is not reused: the figure is priced again, except
where it cannot be (AWS's kernels need an nki-library checkout), and then its own label
says which version it is.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..bench.rows import BenchRow, append_rows, read_rows
from .figure import Figure

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "benchmarks" / "data"
COMMITTED_CACHE = DATA / "ledger_rows.jsonl"
_VERSION = re.compile(r"cost model (v\d+)")


def default_cache() -> Path:
    """The user's ledger cache (XDG_CACHE_HOME respected)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nki-kernels" / "ledger_rows.jsonl"


def version_of(label: str) -> str | None:
    """'v2' from 'modeled (cost model v2, trn2)'."""
    m = _VERSION.search(label)
    return m.group(1) if m else None


def current_version() -> str:
    from ..perfmodel import COST_MODEL_VERSION

    return str(COST_MODEL_VERSION)


def structural_pct_of(provenance: str, target: str) -> float:
    """The structural error a modeled row carries: the current cost model's (v3 and
    later); 0 for measured rows and for rows of an older version (they keep their own
    band, as `bench.bands.widen_ratio` does)."""
    if not provenance.startswith("modeled") or version_of(provenance) != current_version():
        return 0.0
    try:
        from ..perfmodel.band import structural_pct
    except ImportError:
        return 0.0
    return structural_pct(target)


def figure_of(row: BenchRow, source: str) -> Figure:
    """A row as a figure: its band is the range of its per-set samples (op-level rows of
    the current model store it widened by the structural term, which `full_band`
    re-applies), or the row's band when it has no samples."""
    samples = row.extra.get("samples_us")
    structural = structural_pct_of(row.provenance, row.target)
    notes: tuple[str, ...] = ()
    if samples:
        band: tuple[float, float] | None = (float(min(samples)), float(max(samples)))
    elif row.band_us is not None:
        band, structural = (float(row.band_us[0]), float(row.band_us[1])), 0.0
    elif structural:
        # priced with the shipped parameters alone: the band is the structural term only
        band = (row.latency_us, row.latency_us)
        notes = ("band: structural error only (the row's parameter sets were not priced)",)
    else:
        band = None
    return Figure(
        row.latency_us,
        row.provenance,
        source,
        band,
        None if samples is None else tuple(float(s) for s in samples),
        notes,
        structural_pct=structural if band is not None else 0.0,
    )


@dataclass
class RowStore:
    """The committed rows and the cache, loaded once per ledger run."""

    data: Path = DATA
    cache: Path | None = None  # None: the default user cache; Path("-"): no cache writes
    reprice: bool = False  # ignore cached ledger rows (committed op-level rows still used)
    priced: list[str] = field(default_factory=list)  # what was priced in this run
    _bench: list[BenchRow] | None = None
    _cached: dict[str, BenchRow] | None = None

    def bench_rows(self) -> list[BenchRow]:
        if self._bench is None:
            rows: list[BenchRow] = []
            for name in ("bench_rows.jsonl", "peer_rows.jsonl"):
                if (self.data / name).exists():
                    rows += read_rows(self.data / name)
            self._bench = rows
        return self._bench

    def op_row(
        self, family: str, op: str, case: str, target: str, lnc: int, impl: str
    ) -> BenchRow | None:
        """The committed op-level row of exactly this case, any cost-model version."""
        for r in self.bench_rows():
            if (r.family, r.op, r.case, r.target, r.lnc, r.impl) == (
                family,
                op,
                case,
                target,
                lnc,
                impl,
            ) and r.latency_us == r.latency_us:
                if impl == "native" and r.extra.get("baseline") is False:
                    continue  # a dropless MoE candidate that is not the faster one
                return r
        return None

    def decode_aws_rows(self) -> list[dict[str, Any]]:
        p = self.data / "decode_aws_rows.json"
        if not p.exists():
            return []
        return list(json.loads(p.read_text()).get("rows", []))

    def _cache_path(self) -> Path | None:
        if self.cache is not None and str(self.cache) == "-":
            return None
        return self.cache or default_cache()

    def cached(self) -> dict[str, BenchRow]:
        if self._cached is None:
            rows: dict[str, BenchRow] = {}
            paths = [self.data / COMMITTED_CACHE.name]
            own = self._cache_path()
            if own is not None:
                paths.append(own)
            for p in paths:
                if p.exists():
                    for r in read_rows(p):
                        rows[r.case] = r
            self._cached = rows
        return self._cached

    def get_or_price(
        self,
        key: str,
        target: str,
        lnc: int,
        impl: str,
        price: Callable[[Any], float],
        what: str,
    ) -> Figure:
        """The cached figure of `key` (this cost-model version), else `price(target)` in
        microseconds under every parameter set of the band, cached."""
        version = current_version()
        full = f"{key} | {target} LNC {lnc} | {impl} | cost model {version}"
        row = None if self.reprice else self.cached().get(full)
        if row is not None:
            return figure_of(row, f"ledger cache ({what})")
        from ..bench.bands import parameter_sets, replayed_traces
        from ..perfmodel import modeled_label

        sets = parameter_sets(target)
        with replayed_traces():
            samples = [float(price(s)) for s in sets]
        row = BenchRow(
            family="ledger",
            op=what,
            case=full,
            target=target,
            impl=impl,
            latency_us=samples[0],
            provenance=modeled_label(target, version),
            lnc=lnc,
            band_us=(min(samples), max(samples)),
            extra={"samples_us": samples},
        )
        self.cached()[full] = row
        self.priced.append(full)
        own = self._cache_path()
        if own is not None:
            append_rows(own, [row])
        return figure_of(row, f"priced now ({what})")
