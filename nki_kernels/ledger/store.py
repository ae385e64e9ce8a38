"""Where the ledger's Trainium figures come from: committed rows, then a cache, then pricing.

Three sources, in this order, each figure saying which it came from:

1. the op-level benchmark rows (`benchmarks/data/bench_rows.jsonl`: ours and native;
   `peer_rows.jsonl`: AWS's kernels; `decode_aws_rows.json`), used where the case is
   exactly one of theirs and their cost-model version is the current one;
2. ledger rows priced before: the committed `benchmarks/data/ledger_rows.jsonl` and the
   user's cache (default `~/.cache/nki-kernels/ledger_rows.jsonl`), keyed by the
   component, target, LNC and cost-model version, and stamped with a hash of the code and
   shipped configs that determine the figure (`stamps`): a row whose stamp is not the
   current code's is stale, used only with a "stale" mark (or priced again on request);
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..bench.rows import BenchRow, append_rows, read_rows, write_rows
from ..runtime.atomic_files import dir_lock, write_text_atomic
from .figure import Figure

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "benchmarks" / "data"
COMMITTED_CACHE = DATA / "ledger_rows.jsonl"
_VERSION = re.compile(r"cost model (v\d+)")
STALE = "stale: priced before a change to "


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


def partial_path() -> Path:
    """Where a component's per-set samples wait until all of its parameter sets are priced
    (a pricing run stopped by a timeout resumes from them)."""
    return default_cache().parent / "ledger_partial.json"


def _partial(key: str, stamp: str) -> list[float]:
    p = partial_path()
    try:
        got = json.loads(p.read_text()).get(key)
    except (OSError, ValueError):
        return []
    return [float(x) for x in got["samples_us"]] if got and got["stamp"] == stamp else []


def _keep_partial(key: str, stamp: str, samples: list[float] | None) -> None:
    """Record `key`'s samples so far (None: forget them)."""
    p = partial_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    with dir_lock(p.parent):  # concurrent ledger runs keep each other's samples
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            d = {}
        if samples is None:
            if key not in d:
                return
            d.pop(key)
        else:
            d[key] = {"stamp": stamp, "samples_us": samples}
        write_text_atomic(p, json.dumps(d))


@dataclass
class RowStore:
    """The committed rows and the cache, loaded once per ledger run.

    Every ledger row carries the stamp of what determines it (`stamps`): a row whose stamp
    differs from the current code's is *stale*. A stale row is used as printed, its figure
    noted "stale" and listed in `stale`, unless `refresh_stale` (then it is priced again,
    replacing the row in the cache it is written to). `dry` prices nothing: a missing
    component is listed in `missing` and stands in as 0 us (a query of what a command would
    price, not a ledger)."""

    data: Path = DATA
    cache: Path | None = None  # None: the default user cache; Path("-"): no cache writes
    reprice: bool = False  # ignore cached ledger rows (committed op-level rows still used)
    refresh_stale: bool = False  # price stale rows again instead of using them
    dry: bool = False  # price nothing; list what would be priced
    priced: list[str] = field(default_factory=list)  # what was priced in this run
    missing: list[str] = field(default_factory=list)  # dry: what would have been priced
    stale: dict[str, list[str]] = field(default_factory=dict)  # key -> changed determinants
    _bench: list[BenchRow] | None = None
    _cached: dict[str, list[BenchRow]] | None = None

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

    def decode_stream_rows(self) -> list[dict[str, Any]]:
        """The decode benchmark's rows (ours streamed, per program, AWS's attention_tkg)."""
        p = self.data / "decode_stream_rows.json"
        if not p.exists():
            return []
        return list(json.loads(p.read_text()).get("rows", []))

    def _cache_path(self) -> Path | None:
        if self.cache is not None and str(self.cache) == "-":
            return None
        return self.cache or default_cache()

    def cached(self) -> dict[str, list[BenchRow]]:
        """Every cached row per key: the committed file's, then the user cache's."""
        if self._cached is None:
            rows: dict[str, list[BenchRow]] = {}
            paths = [self.data / COMMITTED_CACHE.name]
            own = self._cache_path()
            if own is not None:
                paths.append(own)
            for p in paths:
                if p.exists():
                    for r in read_rows(p):
                        rows.setdefault(r.case, []).append(r)
            self._cached = rows
        return self._cached

    def _save(self, row: BenchRow) -> None:
        """Write `row` to the cache: appended, or replacing a row of its key."""
        own = self._cache_path()
        if own is None:
            return
        old = read_rows(own) if own.exists() else []
        if any(r.case == row.case for r in old):
            write_rows(own, [row if r.case == row.case else r for r in old])
        else:
            append_rows(own, [row])

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
        from . import stamps

        version = current_version()
        full = f"{key} | {target} LNC {lnc} | {impl} | cost model {version}"
        stamp, parts = stamps.stamp(what, impl, target)
        rows = [] if self.reprice else self.cached().get(full, [])
        fresh = [r for r in rows if r.extra.get("stamp") == stamp]
        if fresh:
            return figure_of(fresh[-1], f"ledger cache ({what})")
        if rows and not self.refresh_stale:
            changed = stamps.changed(rows[-1].extra.get("stamp_parts"), parts)
            self.stale[full] = changed
            f = figure_of(rows[-1], f"ledger cache ({what}), STALE")
            return replace(f, notes=(*f.notes, STALE + ", ".join(changed)))
        if self.dry:
            self.missing.append(full)
            return Figure(0.0, f"modeled (cost model {version}, {target})", "not priced (dry)")
        from ..bench.bands import parameter_sets, replayed_traces
        from ..perfmodel import modeled_label

        sets = parameter_sets(target)
        samples = _partial(full, stamp)[: len(sets)]
        with replayed_traces():
            for s in sets[len(samples) :]:
                samples.append(float(price(s)))
                if len(samples) < len(sets):
                    _keep_partial(full, stamp, samples)
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
            extra={"samples_us": samples, "stamp": stamp, "stamp_parts": parts},
        )
        self.cached()[full] = [row]
        self.priced.append(full)
        self._save(row)
        _keep_partial(full, stamp, None)
        return figure_of(row, f"priced now ({what})")
