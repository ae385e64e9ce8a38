"""nki-library's collective test cases: one launch per rank, run cooperatively.

AWS's collective tests hand their `test_manager` a `KernelArgs` whose
`inference_args.collective_ranks` is the number of ranks, whose `kernel_input` is either
one dict for every rank or a `PerRankLazyInputGenerator` (`for_rank(r)` builds rank r's
inputs) and whose golden output is a `LazyGoldenGenerator` (one for every rank) or a
`PerRankLazyGoldenGenerator`. On hardware their orchestrator starts one process per rank;
here `interp.ranks.run_ranks` runs the ranks as cooperating launches of the interpreter
and every rank's outputs are checked against its own golden values. The determinism
check AWS asks of some cases (`num_runs` repeats) is not repeated: the interpreter is
deterministic.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .aws_tests import _target, check_outputs, interpreter_kernel


def collective_ranks(kernel_args: Any) -> int:
    """How many ranks an AWS case launches (1: not a collective case)."""
    inference = getattr(kernel_args, "inference_args", None)
    return int(getattr(inference, "collective_ranks", 1) or 1)


def _own_copies(inputs: dict[str, Any]) -> dict[str, Any]:
    # each rank's arrays are its own: inputs written by the kernel are written back per rank
    return {
        k.removesuffix(".must_alias_input"): v.copy() if isinstance(v, np.ndarray) else v
        for k, v in inputs.items()
    }


def execute_ranks(kernel_args: Any) -> None:
    """Run one AWS collective `KernelArgs` over its ranks and check every rank's outputs
    (AssertionError naming the rank on a mismatch)."""
    from ..interp.ranks import run_ranks

    n = collective_ranks(kernel_args)
    compiler = kernel_args.compiler_input
    lnc = int(getattr(compiler, "logical_nc_config", 1) or 1)
    target = _target(getattr(compiler, "platform_target", None))
    source = kernel_args.kernel_input or {}
    per_rank = [
        _own_copies(source.for_rank(r) if hasattr(source, "for_rank") else source) for r in range(n)
    ]
    kernel = interpreter_kernel(kernel_args.kernel_func)
    results = run_ranks(kernel[lnc] if lnc > 1 else kernel, per_rank, target=target)
    val = kernel_args.validation_args
    if val is None:
        return
    for r, res in enumerate(results):
        try:
            check_outputs(res.outputs, val, rank=r)
        except AssertionError as e:
            raise AssertionError(f"{e} (rank {r} of {n})") from None
