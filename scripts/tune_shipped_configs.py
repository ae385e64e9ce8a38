"""Regenerate the shipped tuned configs (`nki_kernels/configs/<target>/<op>.json`).

Runs `nki-kernels tune` for every kernel family on the standard model shapes
(`nki_kernels.model_shapes`: Llama-3 8B / 70B attention and norms, Mixtral-8x7B and the
64-expert MoE) and buckets, for trn2 and trn3, on the cost model, exporting into the
package's config directory with provenance. Studies live in one SQLite file, so an
interrupted run resumes where it stopped (finished studies are not re-run: their budget
is already met). Re-run it after a kernel changes: lookup refuses configs whose kernel
hash no longer matches.

    python scripts/tune_shipped_configs.py [--targets trn2,trn3] [--ops rms_norm,...]
        [--storage URL] [--workers K] [--dry-run]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "nki_kernels" / "configs"

# op -> (model shapes, buckets, trials per study, extra tune options)
PLAN: dict[str, tuple[tuple[str, ...], tuple[int, ...], int | None, tuple[str, ...]]] = {
    "rms_norm": (("llama3-8b", "llama3-70b"), (2048, 8192, 32768), 120, ()),
    "add_rms_norm": (("llama3-8b", "llama3-70b"), (2048, 8192, 32768), 120, ()),
    "rms_norm_bwd": (("llama3-8b", "llama3-70b"), (2048, 8192, 32768), 80, ()),
    # whole grid (48 configs); mixtral-8x7b has the same attention shape as llama3-8b
    "flash_attention": (("llama3-8b", "llama3-70b"), (2048, 8192, 32768), None, ()),
    "moe_mlp": (("mixtral-8x7b", "fine-grained-64e"), (512, 4096, 16384), 40, ()),
    # whole grid (12 configs); buckets are cache lengths (Sq = 1, contiguous cache)
    "decode_attention": (("llama3-8b", "llama3-70b"), (2048, 32768, 131072), None, ()),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="trn2,trn3")
    ap.add_argument("--ops", default=",".join(PLAN))
    ap.add_argument("--storage", default=str(Path.home() / ".cache" / "nki-kernels" / "shipped.db"))
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    Path(args.storage).parent.mkdir(parents=True, exist_ok=True)
    status = 0
    for op in args.ops.split(","):
        if op not in PLAN:
            raise SystemExit(f"--ops: expected some of {sorted(PLAN)}; got {op!r}")
        shapes, buckets, trials, extra = PLAN[op]
        for target in args.targets.split(","):
            cmd = [sys.executable, "-m", "nki_kernels.cli", "tune", op, "--target", target,
                   "--buckets", ",".join(map(str, buckets)), "--storage", args.storage,
                   "--config-dir", str(CONFIG_DIR), "--gate", "improving",
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
