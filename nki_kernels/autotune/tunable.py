"""What the autotuner needs to know about one op: the `Tunable` adapter.

A kernel family exposes its kernel, config class, reference and tolerances; a `Tunable`
bundles the few calls the tuner makes on them, so the study driver, measurers and the
correctness gate stay independent of any one family (and tests can use a toy kernel).

A *problem* is whatever the family's `KernelConfig.heuristic(problem, target)` takes: the
bucketed shapes and dtype of one launch. The tuner never looks inside it; it asks the
`Tunable` for the study key fields (`bucket_key`, `dtype`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..interp.trace import Trace
from ..kernel_config import KernelConfig
from ..targets import Target

Arrays = Sequence[np.ndarray]


@dataclass(frozen=True)
class Tunable:
    """One tunable op.

    - `trace(problem, config, target)`: a trace-only launch at the problem's full shapes
      (raises `InvalidConfig` / `NkiValidationError` when the config cannot run);
    - `reduced(problem, config, target)`: a small problem of the same bucket family that
      still exercises every tile size of `config` (several tiles per tiled dim and a
      ragged edge where the family allows one), for the numeric correctness gate;
    - `run_numeric(problem, config, target, seed)`: run the kernel in numeric mode on
      seeded random inputs and return `(outputs, reference_outputs)`;
    - `tolerance(problem)`: `(atol, rtol)` for comparing them, or one pair per output;
    - `bucket_key(problem)`, `dtype(problem)`: the study key fields; `problem` is the
      config store's bucketed problem (a dataclass of ints / strings, bucketed by
      `runtime.buckets`), keyed there by `problem_key(problem)`;
    - `kernels`: the `nki.jit` kernels the op launches; the first one's source hash
      (`runtime.kernel_cache.kernel_source_hash`, what config lookup checks) is the
      kernel hash of the study and of exported configs;
    - `device_launcher(problem, config, target)`: optional, for the hardware measurer: a
      zero-argument callable that runs the compiled kernel once on the device and waits;
    - `search_problem(problem)`: optional, a cheaper problem on which configs rank the
      same way (e.g. one KV-head group of attention); trials measure it, and the export
      re-measures the best config and the default on the full problem;
    - `repricing(problem)`: optional, `(unit, n)` when the full problem is `n` identical
      independent units run one after another (attention: KV-head groups x batch); the
      export then prices one unit and multiplies, saying so in the label;
    - `price(problem, config, target)`: optional, the family's own cost-model pricing of
      one launch, `(latency_ns, details)` (MoE: trace-only runs of a few blocks,
      extrapolated per block); the cost-model measurer uses it instead of a full trace;
    - `lnc`: the logical-core count every call above launches the kernel at
      (`kernel[lnc]`: LNC 2 splits the work over two programs, one per physical core);
      studies, exported keys and provenance carry it.
    """

    op: str
    config_cls: type[KernelConfig]
    trace: Callable[[Any, KernelConfig, Target], Trace]
    reduced: Callable[[Any, KernelConfig, Target], Any]
    run_numeric: Callable[[Any, KernelConfig, Target, int], tuple[Arrays, Arrays]]
    tolerance: Callable[[Any], tuple[float, float] | Sequence[tuple[float, float]]]
    bucket_key: Callable[[Any], str]
    dtype: Callable[[Any], str]
    kernels: tuple[Any, ...]
    device_launcher: Callable[[Any, KernelConfig, Target], Callable[[], None]] | None = None
    search_problem: Callable[[Any], Any] | None = None
    repricing: Callable[[Any], tuple[Any, int]] | None = None
    price: Callable[[Any, KernelConfig, Target], tuple[float, dict[str, Any]]] | None = None
    describe: Callable[[Any], str] = field(default=repr)
    lnc: int = 1

    def proxy(self, problem: Any) -> Any:
        """The problem trials are measured on (`search_problem`, or `problem` itself)."""
        return problem if self.search_problem is None else self.search_problem(problem)

    def heuristic(self, problem: Any, target: Target) -> KernelConfig:
        return self.config_cls.heuristic(problem, target)

    def source_hash(self) -> str:
        """The kernel hash config lookup compares against (first kernel's source file)."""
        from ..runtime.kernel_cache import kernel_source_hash

        return kernel_source_hash(self.kernels[0])
