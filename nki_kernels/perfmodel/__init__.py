"""Cost model: an instruction-level timeline of a NeuronCore over the interpreter's trace.

`estimate(kernel, *specs, target=...)` -> `Estimate` (modeled latency, engine busy time,
MFU / HFU / MBU, roofline bound); `estimate_trace(trace)` prices an existing trace;
`chrome_trace` exports the schedule for Perfetto; `summary` prints a profiler-style page.
Every figure is "modeled (cost model <COST_MODEL_VERSION>, <target>)".
"""

from .api import estimate, estimate_trace, schedule_kernel, trace_kernel
from .estimate import COST_MODEL_VERSION, Estimate, modeled_label
from .timeline import Schedule, schedule

__all__ = [
    "COST_MODEL_VERSION",
    "Estimate",
    "Schedule",
    "estimate",
    "estimate_trace",
    "modeled_label",
    "schedule",
    "schedule_kernel",
    "trace_kernel",
]
