"""Regenerate the shipped tuned configs (`nki_kernels/configs/<target>/<op>.json`).

Runs `nki-kernels tune` for every kernel family on the standard model shapes
(`nki_kernels.model_shapes`: Llama-3 8B / 70B attention and norms, Mixtral-8x7B and the
64-expert MoE) and buckets, for trn2 and trn3, on the cost model, at each LNC of
`--lnc` (default 2, the trn2 / trn3 runtime default, then nothing else; `--lnc 2,1` adds
the LNC-1 keys), exporting into the package's config directory with provenance (cost
model version, LNC, ranking, bands). Studies live in one SQLite file, so an interrupted
run resumes where it stopped (finished studies are not re-run: their budget is already
met, and the export is redone). Re-run it after a kernel changes: lookup refuses configs
whose kernel hash no longer matches.

Ranking (`PLAN`): the forward norms rank by the slow end of the cost model's band
(`--rank pessimistic`): their trials are cheap, so pricing the six parameter sets per
trial costs little. The other families rank by the nominal figure: their band costs
3-6x a trial (a full re-trace per set for MoE), more than one session's CPU allows; their
exports still record the tuned and default bands and the speedup's band. `--rank` forces
one ranking for every op.

    python scripts/tune_shipped_configs.py [--targets trn2,trn3] [--ops rms_norm,...]
        [--lnc 2[,1]] [--rank nominal|pessimistic] [--trials OP=N,...]
        [--storage URL] [--workers K] [--config-dir DIR] [--dry-run]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "nki_kernels" / "configs"

# op -> (model shapes, buckets, trials per study (None: whole grid), ranking, extra options)
PLAN: dict[str, tuple[tuple[str, ...], tuple[int, ...], int | None, str, tuple[str, ...]]] = {
    "rms_norm": (("llama3-8b", "llama3-70b"), (2048, 8192, 32768), 40, "pessimistic", ()),
    "add_rms_norm": (("llama3-8b", "llama3-70b"), (2048, 8192, 32768), 40, "pessimistic", ()),
    "rms_norm_bwd": (("llama3-8b", "llama3-70b"), (2048, 8192, 32768), 24, "nominal", ()),
    # mixtral-8x7b has the same attention shape as llama3-8b
    "flash_attention": (("llama3-8b", "llama3-70b"), (2048, 8192, 32768), 16, "nominal", ()),
    "moe_mlp": (("mixtral-8x7b", "fine-grained-64e"), (512, 4096, 16384), 8, "nominal", ()),
    # whole grid (6 configs); buckets are cache lengths (Sq = 1), contiguous and paged
    "decode_attention": (
        ("llama3-8b", "llama3-70b", "llama3-8b,layout=paged", "llama3-70b,layout=paged"),
        (2048, 32768, 131072),
        None,
        "nominal",
        (),
    ),
}
# families whose tuner takes no LNC (autotune/families.OpSpec.tunable): LNC 1 only
LNC1_ONLY: frozenset[str] = frozenset()


def _trials(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, text.split(",")):
        op, _, n = part.partition("=")
        if op not in PLAN or not n.isdigit() or int(n) < 1:
            raise SystemExit(f"--trials: expected OP=N with OP in {sorted(PLAN)}; got {part!r}")
        out[op] = int(n)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="trn2,trn3")
    ap.add_argument("--ops", default=",".join(PLAN))
    ap.add_argument("--lnc", default="2", help="LNCs to tune, in order (e.g. 2,1)")
    ap.add_argument("--rank", choices=("nominal", "pessimistic"), default=None)
    ap.add_argument("--trials", default="", help="per-op budget overrides, e.g. moe_mlp=12")
    ap.add_argument("--storage", default=str(Path.home() / ".cache" / "nki-kernels" / "shipped.db"))
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--config-dir", default=str(CONFIG_DIR))
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    lncs = [int(v) for v in args.lnc.split(",") if v]
    if not lncs or any(v not in (1, 2) for v in lncs):
        raise SystemExit(f"--lnc: expected 1 and / or 2; got {args.lnc!r}")
    budgets = _trials(args.trials)
    Path(args.storage).parent.mkdir(parents=True, exist_ok=True)
    status = 0
    for lnc in lncs:
        for op in args.ops.split(","):
            if op not in PLAN:
                raise SystemExit(f"--ops: expected some of {sorted(PLAN)}; got {op!r}")
            if lnc != 1 and op in LNC1_ONLY:
                print(f"# {op}: its tuner family takes no LNC; tuned at LNC 1 only", flush=True)
                continue
            shapes, buckets, trials, rank, extra = PLAN[op]
            trials = budgets.get(op, trials)
            for target in args.targets.split(","):
                cmd = [sys.executable, "-m", "nki_kernels.cli", "tune", op, "--target", target,
                       "--buckets", ",".join(map(str, buckets)), "--storage", args.storage,
                       "--config-dir", args.config_dir, "--gate", "improving",
                       "--lnc", str(lnc), "--rank", args.rank or rank,
                       "--workers", str(args.workers), "--no-progress", *extra]  # fmt: skip
                for s in shapes:
                    cmd += ["--shape", s]
                if trials is not None:
                    cmd += ["--trials", str(trials)]
                print("$ " + " ".join(cmd[1:]), flush=True)
                if not args.dry_run:
                    status |= subprocess.call(cmd, cwd=REPO)
    return status


if __name__ == "__main__":
    sys.exit(main())
