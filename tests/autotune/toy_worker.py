"""A toy tuning worker process for the multi-process tests.

    python -m tests.autotune.toy_worker STORAGE_URL OP [--strategy grid] [--sleep S]
        [--trials N] [--seed K] [--worker I] [--go FILE]

Prints one line per trial it finished ("trial <number> <outcome>").
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from nki_kernels.autotune.storage import open_storage
from nki_kernels.autotune.study import TuneOptions, Tuner
from nki_kernels.targets import TRN2

from .toy import ToyMeasurer, ToyProblem, make_toy

PROBLEM = ToyProblem(rows=256, cols=8200)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("storage")
    ap.add_argument("op")
    ap.add_argument("--strategy", default="grid")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", type=int, default=0)
    ap.add_argument("--go", default=None, help="print 'ready', then wait for this file")
    args = ap.parse_args(argv)
    tuner = Tuner(
        make_toy(args.op),
        PROBLEM,
        TRN2,
        storage=open_storage(args.storage),
        measurer=ToyMeasurer(sleep_s=args.sleep),
        options=TuneOptions(strategy=args.strategy, seed=args.seed, gate="off"),
        worker=args.worker,
    )

    def show(rec, _tuner):  # type: ignore[no-untyped-def]
        print(f"trial {rec.number} {rec.outcome}", flush=True)

    tuner.study()
    if args.go:  # start together with the other workers (imports take uneven time)
        print("ready", flush=True)
        while not os.path.exists(args.go):
            time.sleep(0.01)
    tuner.run(n_trials=args.trials, on_trial=show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
