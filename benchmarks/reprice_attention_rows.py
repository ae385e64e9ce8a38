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
"""

from __future__ import annotations

import argparse
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
    m = sub.add_parser("merge")
    m.add_argument("rows")
    args = p.parse_args(argv)
    return price(args) if args.cmd == "price" else merge(args)


if __name__ == "__main__":
    sys.exit(main())
