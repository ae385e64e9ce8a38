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
from nki_kernels.perfmodel import COST_MODEL_VERSION

DATA = Path(__file__).resolve().parent / "data" / "decode_stream_rows.json"
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


def table(rows: dict[tuple[Any, ...], dict[str, Any]], group: int, lnc: int) -> str:
    """Markdown rows: cache, layout, B, then each method's ms (band) and MBU, and the
    streamed kernel's speedup over attention_tkg (shipped parameters; low end of the band
    ratio: ours' slow end against AWS's fast end)."""
    out = [
        "| cache | layout | B | streamed, ms (band) | MBU % | per-program, ms (band) | MBU % "
        "| attention_tkg, ms (band) | MBU % | speedup vs AWS (low end) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    current = _stream_hash()
    cells = sorted({(r["cache"], r["paged"], r["batch"]) for r in rows.values()
                    if r["group"] == group and r["lnc"] == lnc})  # fmt: skip
    for cache, paged, b in cells:
        got = {
            m: rows.get((m, group, lnc, b, cache, paged)) for m in (STREAMED, PER_PROGRAM, AWS_TKG)
        }
        line = [f"{cache // 1024} K", "paged" if paged else "contiguous", str(b)]
        for m in (STREAMED, PER_PROGRAM, AWS_TKG):
            r = got[m]
            if r is None or r["latency_us"] != r["latency_us"]:
                line += ["-", "-"]
                continue
            lo, hi = r["band_us"]
            star = "*" if r.get("note", "").startswith("extrapolated") else ""
            if m == STREAMED and r.get("kernel_hash") != current:
                star += STALE_MARK
            line += [f"{_fmt(r['latency_us'] / 1e3)}{star} ({_fmt(lo / 1e3)}-{_fmt(hi / 1e3)})",
                     f"{100 * r['mbu']:.1f}"]  # fmt: skip
        s, a = got[STREAMED], got[AWS_TKG]
        if s and a and a["latency_us"] == a["latency_us"]:
            mark = STALE_MARK if s.get("kernel_hash") != current else ""
            line.append(
                f"{a['latency_us'] / s['latency_us']:.2f}{mark} "
                f"({a['band_us'][0] / s['band_us'][1]:.2f})"
            )
        else:
            line.append("-")
        out.append("| " + " | ".join(line) + " |")
    return "\n".join(out)


def extrapolated(
    rows: dict[tuple[Any, ...], dict[str, Any]], method: str, group: int, lnc: int,
    cache: int, paged: bool, batch: int,
) -> dict[str, Any] | None:  # fmt: skip
    """A row at `batch` from the priced B = 8 and B = 16 rows (else B = 1 and 8): the
    timeline of a launch whose batch tiles repeat one schedule grows linearly in tiles
    once the pipeline is full, so L(B) = L(8) + (B - 8) (L(16) - L(8)) / 8, each band
    end likewise (checked: the streamed kernel's B = 64 x 2 K row priced in full is that
    figure to 0.1 %; attention_tkg's B = 64 x 32 K row is 9 % above it, so its
    extrapolated rows are low, i.e. in its favour)."""
    if (method, group, lnc, batch, cache, paged) in rows:
        return None
    r8, r16 = (rows.get((method, group, lnc, b, cache, paged)) for b in (8, 16))
    lo_b = 8
    if r16 is None:  # from B = 1 and 8 instead
        r8, r16, lo_b = rows.get((method, group, lnc, 1, cache, paged)), r8, 1
    if r8 is None or r16 is None:
        return None
    f = (batch - lo_b) / (16 - lo_b if lo_b == 8 else 7)

    def ext(x8: float, x16: float) -> float:
        return x8 + f * (x16 - x8)

    lat = ext(r8["latency_us"], r16["latency_us"])
    band = [ext(r8["band_us"][i], r16["band_us"][i]) for i in (0, 1)]
    hi_b = 16 if lo_b == 8 else 8
    note = f"extrapolated from the B = {lo_b} and B = {hi_b} rows (linear in batch tiles)"
    mbu = r8["mbu"] * r8["latency_us"] * batch / (lo_b * lat)
    out = {**r8, "batch": batch, "latency_us": lat, "band_us": band, "mbu": mbu, "note": note}
    if r8.get("kernel_hash") != r16.get("kernel_hash"):
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
        help="add rows at this batch from the B = 8 and B = 16 rows in the file",
    )
    a = ap.parse_args()
    path = Path(a.data)
    rows = _load(path)
    group, lnc = SETS[a.set]
    if a.table:
        print(table(rows, group, lnc))
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
                if r["method"] == STREAMED:
                    r["kernel_hash"] = _stream_hash()
                rows[_key(r)] = r
                print(f"{r['method']:26s} g{group} lnc{lnc} B={r['batch']:<3d} {cache:>7d} "
                      f"{'paged' if paged else 'contig':6s} {r['latency_us']:12,.1f} us "
                      f"MBU {100 * r['mbu']:5.1f} %", flush=True)  # fmt: skip
            _save(path, rows)


if __name__ == "__main__":
    main()
