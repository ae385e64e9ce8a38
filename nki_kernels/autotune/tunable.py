"""What the autotuner needs to know about one op: the `Tunable` adapter.

A kernel family exposes its kernel, config class, reference and tolerances; a `Tunable`
bundles the few calls the tuner makes on them, so the study driver, measurers and the
correctness gate stay independent of any one family (and tests can use a toy kernel).

A *problem* is whatever the family's `KernelConfig.heuristic(problem, target)` takes: the
bucketed shapes and dtype of one launch. The tuner never looks inside it; it asks the
`Tunable` for the study key fields (`bucket_key`, `dtype`).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
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
    - `tolerance(problem)`: `(atol, rtol)` for comparing them;
    - `bucket_key(problem)`, `dtype(problem)`: the study key fields (from the project's one
      bucketing function);
    - `sources`: modules whose source text defines the kernel (the kernel hash);
    - `device_launcher(problem, config, target)`: optional, for the hardware measurer: a
      zero-argument callable that runs the compiled kernel once on the device and waits.
    """

    op: str
    config_cls: type[KernelConfig]
    trace: Callable[[Any, KernelConfig, Target], Trace]
    reduced: Callable[[Any, KernelConfig, Target], Any]
    run_numeric: Callable[[Any, KernelConfig, Target, int], tuple[Arrays, Arrays]]
    tolerance: Callable[[Any], tuple[float, float]]
    bucket_key: Callable[[Any], str]
    dtype: Callable[[Any], str]
    sources: tuple[str, ...]
    device_launcher: Callable[[Any, KernelConfig, Target], Callable[[], None]] | None = None
    describe: Callable[[Any], str] = field(default=repr)

    def heuristic(self, problem: Any, target: Target) -> KernelConfig:
        return self.config_cls.heuristic(problem, target)

    def source_hash(self) -> str:
        """sha256 over the source text of `sources` (in order), first 16 hex digits."""
        return source_hash(self.sources)


def source_hash(modules: Sequence[str]) -> str:
    """Hash of the source text of the named modules; changes whenever a kernel changes."""
    h = hashlib.sha256()
    for name in modules:
        mod = importlib.import_module(name)
        h.update(inspect.getsource(mod).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
