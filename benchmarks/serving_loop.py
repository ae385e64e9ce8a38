"""The simulated serving loop at full length (the issue's 200 steps), outside `make test`.

    PYTHONPATH=. python benchmarks/serving_loop.py --steps 200 --model llama
    PYTHONPATH=. python benchmarks/serving_loop.py --steps 200 --model gpt-oss

Runs `nki_kernels.serving.simloop.run` compiled (torch.compile(fullgraph=True), then
`fail_on_recompile`), checks every step's logits against the float64 model over each
sequence's whole history, and prints the worst relative error and the scheduler's counts.
Exits non-zero when the error exceeds the fp32 tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from nki_kernels.serving.simloop import TinyConfig, run

TOLERANCE = 1e-4  # fp32 logits vs float64, relative to max |logit| (two layers, small sums)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--model", choices=("llama", "gpt-oss"), default="llama")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    # tiny matmuls: one thread (a multi-threaded BLAS spins on a shared machine, ~6x slower)
    torch.set_num_threads(1)
    t0 = time.time()

    def progress(step: int, worst: float) -> None:
        if (step + 1) % 10 == 0:
            print(f"step {step + 1}: worst {worst:.2e}, {time.time() - t0:.0f} s", file=sys.stderr)

    cfg = TinyConfig(gpt_oss=args.model == "gpt-oss")
    res = run(cfg, args.steps, seed=args.seed, progress=progress)
    res["seconds"] = round(time.time() - t0, 1)
    print(json.dumps({"model": args.model, **res}))
    return 0 if res["worst_rel_err"] <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
