"""Re-price attention benchmark rows in pieces short enough for a shared machine.

Run: `python benchmarks/reprice_attention_rows.py price --seq 32768 --target trn2 --lnc 1
--impl nki|aws --op fwd --causal 0 --out rows.jsonl [--nki-library PATH]` prices one case
(ours with `bench.bands.with_bands`, AWS's through `bench.peer`, both with their bands
over the cost model's parameter sets) and appends its row to `rows.jsonl`;
`python benchmarks/reprice_attention_rows.py merge rows.jsonl` puts the rows of that file
into `benchmarks/data/bench_rows.jsonl` (ours) and `peer_rows.jsonl` (AWS's), replacing
the rows of the same case. The rows are exactly what `nki-kernels bench --reprice --full
--bands` and `--peer PATH --full` write for those cases; every figure is modeled (cost
model vN, target), never a measurement. Prints the CPU seconds each case took.

On a loaded machine one case may not fit a command's time limit: `price --sets A:B`
prices the case under parameter sets A..B-1 only (the trace made again in each command)
and appends a part to `--out`; `assemble PARTS OUT` puts the parts of each case together
into its row once every set is there (the same row as one command makes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from nki_kernels.bench.rows import append_rows, read_rows, write_rows

DATA = Path(__file__).resolve().parent / "data"


def price(args: argparse.Namespace) -> int:
    causal = bool(args.causal)
    cpu, wall = time.process_time(), time.perf_counter()
    if args.impl == "nki":
        from nki_kernels.bench.bands import with_bands
        from nki_kernels.bench.compare import attention_rows

        rows = with_bands(
            lambda t: attention_rows(
                (args.seq,), [t], (args.lnc,), ops=(args.op,), causals=(causal,)
            ),
            args.target,
        )
    else:
        from nki_kernels.attention import bench as attn
        from nki_kernels.bench import peer
        from nki_kernels.model_shapes import LLAMA3_8B_ATTN as s

        root = Path(args.nki_library)
        calls, mult = peer.attention_calls(args.op, args.seq, causal, args.lnc)
        res = [(c, peer.price_call(root, c, args.target)) for c in calls]
        name = f"flash_attention {args.op}" + (" causal" if causal else "")
        case = f"B=1 H={s.num_heads}/{s.num_kv_heads} S={args.seq} D={s.head_dim} bf16"
        flops = attn.useful_flops(
            args.op, args.seq, args.seq, s.head_dim, s.num_heads // args.lnc, 1, causal
        )
        commit = peer.checkout_commit(root)
        rows = [peer._row("attention", name, case, args.target, args.lnc, res, mult, commit, flops)]
    append_rows(args.out, rows)
    took, took_wall = time.process_time() - cpu, time.perf_counter() - wall
    for r in rows:
        print(
            f"{r.impl} {r.op} {r.case} {r.target} LNC {r.lnc}: {r.latency_us:,.1f} us "
            f"band {r.band_us} {r.provenance} ({took:.0f} s CPU, {took_wall:.0f} s wall)"
        )
    return 0


def price_part(args: argparse.Namespace) -> int:
    """One case under parameter sets [A, B): a JSON line with each set's latency (and,
    with set 0, the row as priced under the shipped set)."""
    from nki_kernels.bench.bands import parameter_sets, replayed_traces

    a, b = (int(x) for x in args.sets.split(":"))
    sets = parameter_sets(args.target)
    causal = bool(args.causal)
    cpu = time.process_time()
    part: dict = {"tag": _tag(args), "target": args.target, "sets": len(sets), "samples": {}}
    if args.impl == "nki":
        from nki_kernels.bench.compare import attention_rows

        with replayed_traces():
            for i in range(a, min(b, len(sets))):
                (row,) = attention_rows(
                    (args.seq,), [sets[i]], (args.lnc,), ops=(args.op,), causals=(causal,)
                )
                part["samples"][i] = row.latency_us
                if i == 0:
                    part["row"] = row.to_json()
    else:
        from nki_kernels.bench import peer
        from nki_kernels.conformance import loader
        from nki_kernels.perfmodel import estimate_trace, schedule, trace_kernel
        from nki_kernels.perfmodel.compiled import reuse_compiled

        (call,), _ = peer.attention_calls(args.op, args.seq, causal, args.lnc)
        mod = loader.load_module(Path(args.nki_library), call.module)
        fn = getattr(mod, call.attr)
        kernel = fn if hasattr(fn, "__getitem__") and hasattr(fn, "fn") else loader.jit(fn)
        with loader.mapped_nki():
            trace = trace_kernel(
                kernel, *call.args, target=args.target, lnc=call.lnc, **call.kwargs
            )
        with reuse_compiled():
            if a == 0:
                est = estimate_trace(trace, args.target)
                part["est"] = [est.latency_ns * call.repeat / 1e3, len(trace), est.bottleneck]
            for i in range(a, min(b, len(sets))):
                part["samples"][i] = schedule(trace, sets[i]).latency_ns * call.repeat / 1e3
    with open(args.out, "a") as f:
        f.write(json.dumps(part) + "\n")
    print(f"{part['tag']} sets {a}:{b}: {time.process_time() - cpu:.0f} s CPU")
    return 0


def _tag(args: argparse.Namespace) -> str:
    return f"{args.impl}:{args.target}:{args.lnc}:{args.op}:{args.causal}:{args.seq}"


def assemble(args: argparse.Namespace) -> int:
    """Rows of the cases whose every parameter set has a part (as one command makes them)."""
    from dataclasses import replace

    from nki_kernels.bench.bands import latency_band
    from nki_kernels.bench.rows import BenchRow

    parts: dict[str, dict] = {}
    for path in args.parts:
        for line in Path(path).read_text().splitlines():
            p = json.loads(line)
            got = parts.setdefault(p["tag"], {"samples": {}})
            got["samples"].update({int(k): v for k, v in p["samples"].items()})
            got.update({k: v for k, v in p.items() if k != "samples"})
    rows = []
    for tag, p in parts.items():
        n = p["sets"]
        if sorted(p["samples"]) != list(range(n)):
            print(f"{tag}: sets {sorted(p['samples'])} of {n}, not assembled")
            continue
        samples = [p["samples"][i] for i in range(n)]
        impl, target, lnc, op, causal, seq = tag.split(":")
        if impl == "nki":
            d = json.loads(p["row"])
            d["band_us"] = tuple(d["band_us"]) if d.get("band_us") else None
            row = BenchRow(**d)
            rows.append(
                replace(
                    row,
                    band_us=latency_band(samples, target),
                    extra={**row.extra, "samples_us": samples},
                )
            )
        else:
            from nki_kernels.attention import bench as attn
            from nki_kernels.bench import peer
            from nki_kernels.model_shapes import LLAMA3_8B_ATTN as s

            lnc_i, seq_i, is_causal = int(lnc), int(seq), bool(int(causal))
            calls, mult = peer.attention_calls(op, seq_i, is_causal, lnc_i)
            lat, count, busiest = p["est"]
            res = [(calls[0], peer.PeerResult(lat, "", count, busiest, tuple(samples)))]
            name = f"flash_attention {op}" + (" causal" if is_causal else "")
            case = f"B=1 H={s.num_heads}/{s.num_kv_heads} S={seq_i} D={s.head_dim} bf16"
            flops = attn.useful_flops(
                op, seq_i, seq_i, s.head_dim, s.num_heads // lnc_i, 1, is_causal
            )
            commit = peer.checkout_commit(Path(args.nki_library))
            rows.append(peer._row("attention", name, case, target, lnc_i, res, mult, commit, flops))
        print(f"{tag}: assembled ({rows[-1].latency_us:,.1f} us, {rows[-1].provenance})")
    append_rows(args.out, rows)
    return 0


def merge(args: argparse.Namespace) -> int:
    new = read_rows(args.rows)
    for name, impls in (("bench_rows.jsonl", ("nki",)), ("peer_rows.jsonl", ("aws",))):
        got = [r for r in new if r.impl in impls]
        if not got:
            continue
        done = {(r.family, r.op, r.case, r.target, r.lnc, r.impl) for r in got}
        path = DATA / name
        old = read_rows(path)
        kept = [r for r in old if (r.family, r.op, r.case, r.target, r.lnc, r.impl) not in done]
        # keep the file's order: each new row where the row it replaces was
        pos = {(r.family, r.op, r.case, r.target, r.lnc, r.impl): r for r in got}
        out, placed = [], set()
        for r in old:
            k = (r.family, r.op, r.case, r.target, r.lnc, r.impl)
            if k in pos:
                if k not in placed:
                    out.append(pos[k])
                    placed.add(k)
            else:
                out.append(r)
        out += [r for k, r in pos.items() if k not in placed]
        assert len(out) == len(kept) + len(pos)
        write_rows(path, out)
        print(f"{len(got)} rows merged into {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("price")
    a.add_argument("--seq", type=int, required=True)
    a.add_argument("--target", required=True)
    a.add_argument("--lnc", type=int, required=True)
    a.add_argument("--impl", choices=("nki", "aws"), required=True)
    a.add_argument("--op", choices=("fwd", "bwd"), required=True)
    a.add_argument("--causal", type=int, choices=(0, 1), required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--nki-library", default="", help="aws-neuron/nki-library checkout (aws)")
    a.add_argument("--sets", default="", help="A:B: only parameter sets A..B-1 (a part)")
    m = sub.add_parser("merge")
    m.add_argument("rows")
    s = sub.add_parser("assemble")
    s.add_argument("out")
    s.add_argument("parts", nargs="+")
    s.add_argument("--nki-library", default="", help="the checkout the AWS parts priced")
    args = p.parse_args(argv)
    if args.cmd == "price":
        return price_part(args) if args.sets else price(args)
    return assemble(args) if args.cmd == "assemble" else merge(args)


if __name__ == "__main__":
    sys.exit(main())
