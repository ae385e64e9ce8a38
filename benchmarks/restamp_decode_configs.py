"""Re-stamp the shipped `decode_attention` configs and the streamed rows of
`benchmarks/data/decode_stream_rows.json` after a change to the streamed decode kernel's
source that leaves the priced instructions alone (no re-tuning, no re-pricing).

For every entry of `nki_kernels/configs/<target>/decode_attention.json`: the entry's
config is priced as the tuner prices it (`autotune.decode_family`'s trace-only launch,
`perfmodel.estimate_trace` on the target's shipped parameter set, at the entry's LNC).
Where the price equals the recorded `latency_ns` (relative 1e-9), the entry gets the
kernel's current source hash and nothing else changes; otherwise the entry is left as it
is (stale: refused by the config store) and reported, to be re-tuned. `--rows`: every
priced "ours (streamed)" row of decode_stream_rows.json is traced again
(`attention.bench_decode.streamed_row`'s launch, shipped parameter set) and compared with
its recorded latency; when all of them price as recorded, the rows carrying the old hash
(the extrapolated ones follow from the priced ones) get the current one. Every figure is
modeled, none measured.

    python benchmarks/restamp_decode_configs.py [--targets trn2,trn3] [--rows] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from nki_kernels.attention.decode_host import DecodeProblem, StreamConfig
from nki_kernels.autotune.decode_family import _kernel, _trace
from nki_kernels.perfmodel import estimate_trace
from nki_kernels.runtime import kernel_source_hash
from nki_kernels.targets import get_target

CONFIG_DIR = Path(__file__).resolve().parents[1] / "nki_kernels" / "configs"
ROWS = Path(__file__).resolve().parent / "data" / "decode_stream_rows.json"


def _problem(key: str) -> tuple[DecodeProblem, int]:
    f = dict(part.split("=") for part in key.split(","))
    p = DecodeProblem(
        int(f["batch"]), int(f["q_heads"]), int(f["kv_heads"]), int(f["seq_q"]),
        int(f["seq_k"]), int(f["head_dim"]), f["dtype"], f["layout"],
    )  # fmt: skip
    return p, int(f.get("lnc", 1))


def restamp_rows(khash: str, dry_run: bool) -> None:
    """Re-stamp decode_stream_rows.json's streamed rows (see the module docstring)."""
    from nki_kernels.attention.bench_decode import streamed_row

    data = json.loads(ROWS.read_text())
    stamped = [r for r in data["rows"] if r.get("kernel_hash") not in (None, khash)]
    priced = [r for r in stamped if "extrapolated" not in r.get("note", "")]
    same = 0
    for r in priced:
        t0 = time.perf_counter()
        row = streamed_row(r["group"], r["batch"], r["cache"], r["paged"], r["lnc"], r["target"])
        ok = abs(row.latency_us - r["latency_us"]) <= 1e-9 * r["latency_us"]
        same += ok
        print(f"row {r['group']} B={r['batch']} L={r['cache']} paged={r['paged']} LNC {r['lnc']}: "
              f"{r['latency_us']:.3f} -> {row.latency_us:.3f} us {'same' if ok else 'DIFFERS'} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
    print(f"rows: {same} of {len(priced)} priced rows as recorded ({len(stamped)} stamped)")
    if same == len(priced) and not dry_run:
        for r in stamped:
            r["kernel_hash"] = khash
        ROWS.write_text(json.dumps(data, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="trn2,trn3")
    ap.add_argument("--dry-run", action="store_true", help="price and report, write nothing")
    ap.add_argument("--rows", action="store_true", help="decode_stream_rows.json, not configs")
    args = ap.parse_args()
    khash = kernel_source_hash(_kernel())
    if args.rows:
        restamp_rows(khash, args.dry_run)
        return
    for target in args.targets.split(","):
        path = CONFIG_DIR / target / "decode_attention.json"
        data = json.loads(path.read_text())
        tgt = get_target(target)
        same = 0
        for key, entry in data["entries"].items():
            t0 = time.perf_counter()
            p, lnc = _problem(key)
            cfg = StreamConfig(**entry["config"])
            got = float(estimate_trace(_trace(p, cfg, tgt, lnc), tgt).latency_ns)
            want = float(entry["provenance"]["latency_ns"])
            ok = abs(got - want) <= 1e-9 * want
            same += ok
            print(f"{target} {key}: {want:.1f} -> {got:.1f} ns {'same' if ok else 'DIFFERS'} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
            if ok:
                entry["provenance"]["kernel_hash"] = khash
        print(f"{target}: {same} of {len(data['entries'])} entries priced as recorded")
        if not args.dry_run:
            path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
