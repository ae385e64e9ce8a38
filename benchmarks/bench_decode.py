"""Decode attention, modeled: the streamed kernel vs the per-program kernel vs nki-library's
attention_tkg (trn2, cost model vN, every figure with its band; never a measurement).

Run: `python benchmarks/bench_decode.py [--set main|gqa8|lnc2] [--methods streamed,
per-program,aws] [--batches 1,8,64] [--caches 2048,32768,131072] [--nki-library PATH]
[--data FILE] [--table]`. Each priced row is merged into `--data` (default
benchmarks/data/decode_stream_rows.json, keyed by method, GQA group, LNC, batch, cache and
layout), so the table can be priced in pieces; `--table` prints the markdown table of the
rows in the file. Sets: main = Llama-3 8B heads (GQA 4 : 1) at LNC 1; gqa8 = 64 query /
8 KV heads (8 : 1) at LNC 1; lnc2 = GQA 4 : 1 at LNC 2. AWS rows need a local
aws-neuron/nki-library checkout (`--nki-library`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from nki_kernels.attention.bench_decode import (
    AWS_TKG,
    PER_PROGRAM,
    STREAMED,
    Row,
    aws_row,
    per_program_rows,
    rows_as_dicts,
    streamed_row,
)
from nki_kernels.bench.bands import ceiling_label, ratio_band
from nki_kernels.perfmodel import COST_MODEL_VERSION

DATA = Path(__file__).resolve().parent / "data" / "decode_stream_rows.json"
# the table as priced on cost model v2 (kept beside the current one, never mixed with it)
OLD_DATA = Path(__file__).resolve().parent / "data" / "decode_stream_rows_v2.json"
# a streamed row priced on other kernel source than the current (no matching kernel_hash)
STALE_MARK = " (stale)"
SETS = {"main": (4, 1), "gqa8": (8, 1), "lnc2": (4, 2)}


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["method"], r["group"], r["lnc"], r["batch"], r["cache"], r["paged"])


def _load(path: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    if not path.exists():
        return {}
    return {_key(r): r for r in json.loads(path.read_text())["rows"]}


def _save(path: Path, rows: dict[tuple[Any, ...], dict[str, Any]]) -> None:
    head = {"cost_model": COST_MODEL_VERSION, "target": "trn2"}

    def order(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["group"], r["lnc"], r["cache"], r["paged"], r["batch"], r["method"])

    ordered = sorted(rows.values(), key=order)
    path.write_text(json.dumps({**head, "rows": ordered}, indent=1) + "\n")


def _fmt(x: float) -> str:
    return (
        f"{x:,.3f}" if x < 1 else f"{x:,.2f}" if x < 10 else f"{x:,.1f}" if x < 100 else f"{x:,.0f}"
    )


def _speedup(s: dict[str, Any] | None, a: dict[str, Any] | None) -> str:
    """attention_tkg / streamed at the shipped parameters, with its band: per-set ratios
    (the same parameter set on both sides) widened by the structural error of two
    figures (`bench.bands.ratio_band`); rows without per-set samples (cost model v2)
    pair AWS's fast end with ours' slow end, as v2 did."""
    if not s or not a or a["latency_us"] != a["latency_us"]:
        return "-"
    ratio = a["latency_us"] / s["latency_us"]
    if s.get("samples_us") and a.get("samples_us"):
        lo, hi = ratio_band(s["samples_us"], a["samples_us"], "trn2")
        return f"{ratio:.2f} ({lo:.2f}-{hi:.2f})"
    return f"{ratio:.2f} ({a['band_us'][0] / s['band_us'][1]:.2f})"


def _cell(r: dict[str, Any] | None, stale: bool = False) -> list[str]:
    if r is None or r["latency_us"] != r["latency_us"]:
        return ["-", "-"]
    lo, hi = r["band_us"]
    star = "*" if r.get("note", "").startswith("extrapolated") else ""
    star += STALE_MARK if stale else ""
    # a modeled HBM fraction above the best published one reads "ceiling"
    mbu = f"{100 * r['mbu']:.1f}"
    if r.get("label", "").startswith(f"modeled (cost model {COST_MODEL_VERSION}"):
        mbu = ceiling_label(mbu, "decode_attention", hbm_fraction=r["mbu"])
    return [f"{_fmt(r['latency_us'] / 1e3)}{star} ({_fmt(lo / 1e3)}-{_fmt(hi / 1e3)})",
            mbu]  # fmt: skip


def table(
    rows: dict[tuple[Any, ...], dict[str, Any]],
    group: int,
    lnc: int,
    old: dict[tuple[Any, ...], dict[str, Any]] | None = None,
) -> str:
    """Markdown rows: cache, layout, B, then the streamed kernel and attention_tkg (ms
    with band, MBU), the speedup with its band, the per-program kernel, and from `old`
    (the cost model v2 table) the speedup it gave (with its low end)."""
    out = [
        "| cache | layout | B | streamed, ms (band) | MBU % | attention_tkg, ms (band) | MBU % "
        "| speedup vs AWS (band) | per-program, ms (band) | MBU % | v2: speedup (low end) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    current = _stream_hash()
    # the table's batches; other priced batches (B = 2, 4) only feed extrapolations
    mine = [r for r in rows.values() if (r["group"], r["lnc"]) == (group, lnc)]
    cells = sorted({(r["cache"], r["paged"], r["batch"]) for r in mine if r["batch"] in (1, 8, 64)})
    for cache, paged, b in cells:
        got = {
            m: rows.get((m, group, lnc, b, cache, paged)) for m in (STREAMED, PER_PROGRAM, AWS_TKG)
        }
        s = got[STREAMED]
        stale = s is not None and s.get("kernel_hash") != current
        line = [f"{cache // 1024} K", "paged" if paged else "contiguous", str(b)]
        line += _cell(s, stale) + _cell(got[AWS_TKG])
        line.append(_speedup(s, got[AWS_TKG]) + (STALE_MARK if stale else ""))
        line += _cell(got[PER_PROGRAM])
        o = old or {}
        line.append(
            _speedup(
                o.get((STREAMED, group, lnc, b, cache, paged)),
                o.get((AWS_TKG, group, lnc, b, cache, paged)),
            )
        )
        out.append("| " + " | ".join(line) + " |")
    return "\n".join(out)


def extrapolated(
    rows: dict[tuple[Any, ...], dict[str, Any]], method: str, group: int, lnc: int,
    cache: int, paged: bool, batch: int,
) -> dict[str, Any] | None:  # fmt: skip
    """A row at `batch` from the two largest priced batches below it (B = 1 and 8 where
    those are the priced ones): the timeline of a launch whose batch tiles repeat one
    schedule grows linearly in tiles once the pipeline is full, so
    L(B) = L(b1) + (B - b1) (L(b2) - L(b1)) / (b2 - b1), each parameter set's sample and
    each band end likewise (checked against priced rows in the README)."""
    if (method, group, lnc, batch, cache, paged) in rows:
        return None
    priced = sorted(
        b
        for (m, g, n, b, c, pg), r in rows.items()
        if (m, g, n, c, pg) == (method, group, lnc, cache, paged)
        and b < batch
        and not r.get("note", "").startswith("extrapolated")
    )
    if len(priced) < 2:
        return None
    b1, b2 = priced[-2:]
    r1, r2 = (rows[(method, group, lnc, b, cache, paged)] for b in (b1, b2))
    f = (batch - b1) / (b2 - b1)

    def ext(x1: float, x2: float) -> float:
        return x1 + f * (x2 - x1)

    lat = ext(r1["latency_us"], r2["latency_us"])
    band = [ext(r1["band_us"][i], r2["band_us"][i]) for i in (0, 1)]
    samples = [ext(x, y) for x, y in zip(r1.get("samples_us", ()), r2.get("samples_us", ()))]
    note = f"extrapolated from the B = {b1} and B = {b2} rows (linear in batch tiles)"
    mbu = r1["mbu"] * r1["latency_us"] * batch / (b1 * lat)
    out = {**r1, "batch": batch, "latency_us": lat, "band_us": band, "mbu": mbu, "note": note,
           "samples_us": samples}  # fmt: skip
    if r1.get("kernel_hash") != r2.get("kernel_hash"):
        out.pop("kernel_hash", None)  # priced on different kernel source: not current
    return out


def _stream_hash() -> str:
    """Source hash of the streamed kernel: a streamed row priced on other source is
    marked stale in the table."""
    from nki_kernels.attention.decode_stream import decode_stream_fwd
    from nki_kernels.runtime.kernel_cache import kernel_source_hash

    return kernel_source_hash(decode_stream_fwd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=tuple(SETS), default="main")
    ap.add_argument("--methods", default="streamed,per-program,aws")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--caches", default="2048,32768,131072")
    ap.add_argument("--layouts", default="contiguous,paged")
    ap.add_argument("--nki-library", default=None)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--table", action="store_true")
    ap.add_argument(
        "--extrapolate",
        type=int,
        default=None,
        help="add rows at this batch from the two largest priced batches below it",
    )
    a = ap.parse_args()
    path = Path(a.data)
    rows = _load(path)
    group, lnc = SETS[a.set]
    if a.table:
        print(table(rows, group, lnc, _load(OLD_DATA)))
        return
    methods = a.methods.split(",")
    if a.extrapolate:
        for cache in (int(x) for x in a.caches.split(",")):
            for paged in (x == "paged" for x in a.layouts.split(",")):
                for m in (STREAMED, AWS_TKG):
                    r = extrapolated(rows, m, group, lnc, cache, paged, a.extrapolate)
                    if r is not None:
                        rows[_key(r)] = r
        _save(path, rows)
        return
    batches = tuple(int(x) for x in a.batches.split(","))
    for cache in (int(x) for x in a.caches.split(",")):
        for paged in (x == "paged" for x in a.layouts.split(",")):
            new: list[Row] = []
            if "per-program" in methods:
                new += per_program_rows(group, cache, paged, batches, lnc)
            for b in batches:
                if "streamed" in methods:
                    new.append(streamed_row(group, b, cache, paged, lnc))
                if "aws" in methods and a.nki_library:
                    new.append(aws_row(a.nki_library, group, b, cache, paged, lnc))
            for r in rows_as_dicts(new):
                r["band_us"] = list(r["band_us"])
                r["samples_us"] = list(r["samples_us"])
                if r["method"] == STREAMED:
                    r["kernel_hash"] = _stream_hash()
                rows[_key(r)] = r
                print(f"{r['method']:26s} g{group} lnc{lnc} B={r['batch']:<3d} {cache:>7d} "
                      f"{'paged' if paged else 'contig':6s} {r['latency_us']:12,.1f} us "
                      f"MBU {100 * r['mbu']:5.1f} %", flush=True)  # fmt: skip
            _save(path, rows)


if __name__ == "__main__":
    main()
